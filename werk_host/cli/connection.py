"""How the ``werk`` commands that talk to a running ``werk serve`` connect, and how they fail
(docs/cli.md, "Output and exit codes").

Contracts:

* **Server.** ``--server URL``, else ``$WERK_SERVER``, else ``http://127.0.0.1:11434``. A URL
  without a scheme (``127.0.0.1:8080``, ``localhost:8080``, ``[::1]:8080``) is taken as
  ``http://`` (:func:`with_scheme`); anything else the bundled client refuses is an
  :class:`~werk_host.client.InvalidBaseUrlError` (exit 12), reported in one line.
* **Key.** ``WERK_API_KEY``, else (only when stdin is a terminal) a hidden prompt; never argv
  (:class:`RefuseKeyOnArgv`).
* **Errors.** :func:`emit_error` prints one line ``werk: <problem> (<fix>)`` on stderr
  (:func:`describe_error` says which), or under ``--json`` the JSON error object
  ``{"error": {"type", "code", "message", "retryable", "request_id", "status"}}`` unchanged for
  scripts. :func:`exit_code_for` maps the error's class to its documented exit code
  (:data:`EXIT_CODES`, the most specific class in the MRO wins). Messages carry neither the key
  nor a handoff: the client scrubs both from anything a server sends back.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from typing import Any

from werk_host.cli.arguments import KEY_ENV, RefuseKeyOnArgv
from werk_host.cli.output import fail, wants_json
from werk_host.client import (
    DEFAULT_SERVER,
    DEFAULT_TIMEOUT,
    ClientConfigError,
    ClientTimeoutError,
    ConflictError,
    CorruptStateError,
    ExperimentalOptInRequiredError,
    ExpiredHandoffError,
    ForbiddenError,
    FramingError,
    IncompatibleProtocolError,
    IncompatibleStateError,
    IncompatibleVersionError,
    InternalServerError,
    InvalidBaseUrlError,
    InvalidRequestError,
    NotFoundError,
    ProtocolViolationError,
    RedirectError,
    RequestTooLargeError,
    ResourceExhaustedError,
    ResponseTooLargeError,
    TransportError,
    UnauthorizedError,
    UnavailableError,
    UnsupportedError,
    VersionHeaderMismatchError,
    WerkApiError,
    WerkClientError,
    WerkProtocolClient,
    parse_base_url,
)
from werk_host.deployments.durations import MAX_DURATION_S

SERVER_ENV = "WERK_SERVER"


class InputError(Exception):
    """Invalid local input (flag values, JSON files). Its message never echoes file contents."""

    code = "invalid_input"


class HandoffFileError(Exception):
    """A handoff file could not be created, written or read safely."""

    code = "handoff_file"


EXIT_OK = 0
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

#: Error class -> exit code; the most specific class in an error's MRO wins (docs/cli.md).
EXIT_CODES: dict[type[BaseException], int] = {
    WerkClientError: 1,
    TransportError: 3,
    ClientTimeoutError: 4,
    ProtocolViolationError: 5,
    FramingError: 6,
    ResponseTooLargeError: 7,
    RedirectError: 8,
    VersionHeaderMismatchError: 9,
    IncompatibleVersionError: 10,
    RequestTooLargeError: 11,
    InvalidBaseUrlError: 12,
    ClientConfigError: 13,
    InputError: 14,
    HandoffFileError: 15,
    WerkApiError: 19,
    InvalidRequestError: 20,
    IncompatibleProtocolError: 21,
    UnauthorizedError: 22,
    ForbiddenError: 23,
    NotFoundError: 24,
    ConflictError: 25,
    IncompatibleStateError: 26,
    ExpiredHandoffError: 27,
    ExperimentalOptInRequiredError: 28,
    ResourceExhaustedError: 29,
    UnsupportedError: 30,
    UnavailableError: 31,
    CorruptStateError: 32,
    InternalServerError: 33,
}


def exit_code_for(error: BaseException) -> int:
    for cls in type(error).__mro__:
        if cls in EXIT_CODES:
            return EXIT_CODES[cls]
    return 1


# -- server and key ------------------------------------------------------------------------
def with_scheme(server: str) -> str:
    """``HOST:PORT`` without a scheme is taken as ``http://HOST:PORT``; anything else as given."""
    return server if "://" in server else "http://" + server


def server_of(args: argparse.Namespace | None) -> str:
    """The server a command talks to: ``--server``, else ``$WERK_SERVER``, else the default."""
    given = getattr(args, "server", None) if args is not None else None
    return with_scheme(given or os.environ.get(SERVER_ENV) or DEFAULT_SERVER)


def _api_key() -> str | None:
    key = os.environ.get(KEY_ENV, "").strip()
    if key:
        return key
    stdin = sys.stdin
    if stdin is not None and stdin.isatty():
        entered = getpass.getpass("Werk API key (empty for none): ").strip()
        return entered or None
    return None


def client_for(args: argparse.Namespace) -> WerkProtocolClient:
    return WerkProtocolClient(server_of(args), _api_key(), timeout=args.timeout, deployment=args.deployment)


# -- one-line errors -----------------------------------------------------------------------
def _flat(text: str) -> str:
    return " ".join(text.split())


def _display(server: str | None) -> str | None:
    """The server's canonical URL for a message (``None`` when it is not a valid one)."""
    if server is None:
        return None
    try:
        return parse_base_url(server).url
    except InvalidBaseUrlError:
        return None


def _api_fix(error: WerkApiError) -> str | None:
    if isinstance(error, ExperimentalOptInRequiredError):
        return "pass --allow-experimental to opt in"
    if isinstance(error, ExpiredHandoffError):
        return "the handoff was used or has expired; prefill again for a new one"
    if isinstance(error, UnsupportedError):
        return "this server's backend does not offer it; see `werk runtime capabilities`"
    if isinstance(error, InternalServerError):
        return "see the server's log"
    if error.retryable:
        return "retry later"
    return None


def describe_error(
    error: BaseException, server: str | None = None, timeout: float | None = None
) -> tuple[str, str | None]:
    """``(problem, fix)`` for one line ``werk: <problem> (<fix>)``; ``server`` is the URL the
    command talked to and ``timeout`` its ``--timeout`` (both optional, for the wording)."""
    url = _display(server)
    at = f" at {url}" if url else ""
    message = _flat(str(error.message) if isinstance(error, WerkClientError) else str(error))
    if isinstance(error, InvalidBaseUrlError):
        reason = message.removesuffix("; expected http://HOST:PORT").replace(" (Werk does not", ": Werk does not")
        reason = reason.removesuffix(")") if ": Werk does not" in reason else reason
        return reason, f"pass --server http://HOST:PORT or set {SERVER_ENV} to one"
    if isinstance(error, ClientConfigError):
        if "API key" in message:
            return message, f"fix {KEY_ENV}"
        if "deployment" in message:
            return message, "fix --deployment (an instance id from `werk deployments`)"
        if "timeout" in message:
            return message, "pass --timeout SECONDS"
        return message, None
    if isinstance(error, RequestTooLargeError):
        return message, "send less: a request is at most 1 MiB"
    if isinstance(error, ClientTimeoutError):
        within = f" within {timeout:g} s" if timeout is not None else " in time"
        return f"no answer from werk serve{at}{within}", "pass a larger --timeout SECONDS, or check that it is up"
    if isinstance(error, TransportError):
        if message.startswith("cannot connect to "):
            where = url or message.removeprefix("cannot connect to ").rsplit(": ", 1)[0]
            return (
                f"cannot reach werk serve at {where}",
                f"start it with `werk serve`, or pass --server URL or set {SERVER_ENV}",
            )
        return f"the connection to werk serve{at} failed: {message}", "retry; if it persists, see the server's log"
    if isinstance(error, RedirectError):
        return f"the server{at} answered with a redirect", f"pass the werk serve URL itself as --server or {SERVER_ENV}"
    if isinstance(error, IncompatibleVersionError):
        return f"the server{at} speaks another protocol version: {message}", "use a matching werk on both sides"
    if isinstance(error, ProtocolViolationError):
        return (
            f"the server{at} did not answer as werk serve: {message}",
            f"check that --server or {SERVER_ENV} points at werk serve",
        )
    if isinstance(error, UnauthorizedError):
        the_server = f"the server{at}" if at else "the server"
        if os.environ.get(KEY_ENV, "").strip():
            return f"{the_server} did not accept the API key in {KEY_ENV}", f"set {KEY_ENV} to one of its keys"
        return f"{the_server} requires an API key", f"set {KEY_ENV}"
    if isinstance(error, ForbiddenError):
        if "operator" in message.lower():
            return message, (
                f"set {KEY_ENV} to an operator key: one given to werk serve with --operator-api-key-file "
                "or WERK_OPERATOR_API_KEYS"
            )
        return message, f"the key in {KEY_ENV} may not do this; an operator key may"
    if isinstance(error, WerkApiError):
        detail = [error.code]
        if error.status is not None:
            detail.append(f"HTTP {error.status}")
        if error.request_id:
            detail.append(f"request {error.request_id}")
        fix = _api_fix(error)
        return message, ", ".join(detail) + (f"; {fix}" if fix else "")
    return message, None


def _json_body(error: BaseException) -> dict[str, Any]:
    if isinstance(error, WerkClientError):
        return error.as_dict()
    return {
        "type": type(error).__name__,
        "code": getattr(error, "code", "error"),
        "message": str(error),
        "retryable": False,
        "request_id": None,
        "status": None,
    }


def emit_error(error: BaseException, args: argparse.Namespace | None = None, *, as_json: bool | None = None) -> None:
    """Report ``error`` on stderr: one line with the fix, or the JSON error object when
    ``as_json`` (default: the command's ``--json``; without ``args``, text)."""
    if as_json if as_json is not None else (args is not None and wants_json(args)):
        print(json.dumps({"error": _json_body(error)}, indent=2, sort_keys=True), file=sys.stderr, flush=True)
        return
    timeout = getattr(args, "timeout", None) if args is not None else None
    server = server_of(args) if args is not None else None
    problem, fix = describe_error(error, server, timeout if isinstance(timeout, int | float) else None)
    fail(None, problem, fix)


# -- options -------------------------------------------------------------------------------
def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected seconds") from None
    if not 0 < value <= MAX_DURATION_S:  # the host's duration bound: a year
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, at most {MAX_DURATION_S:.0f}")
    return value


def connection_options() -> argparse.ArgumentParser:
    """A parent parser with ``--server``, ``--timeout`` and ``--deployment`` (and the refused
    ``--api-key``); its group's help says where the server and the key come from."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--api-key", action=RefuseKeyOnArgv, help=argparse.SUPPRESS)
    group = common.add_argument_group(
        "connection",
        f"The server is --server, else ${SERVER_ENV}, else {DEFAULT_SERVER}. The API key is read from "
        f"${KEY_ENV} (or a hidden prompt when stdin is a terminal), never from the command line.",
    )
    group.add_argument(
        "--server",
        metavar="URL",
        help=f"werk serve's http://HOST:PORT; HOST:PORT alone means http:// "
        f"(default: ${SERVER_ENV} or {DEFAULT_SERVER})",
    )
    group.add_argument(
        "--timeout",
        type=_timeout,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"seconds per request (default {DEFAULT_TIMEOUT:g})",
    )
    group.add_argument("--deployment", metavar="ID", help="deployment instance id sent as X-Werk-Deployment")
    return common
