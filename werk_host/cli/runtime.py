"""``werk runtime …``: a thin pretty-JSON interface over :class:`WerkProtocolClient`.

Commands (every ``/werk/v1`` route)::

    werk runtime info | capabilities | memory | observability | deployments
    werk runtime states list   [--model-id M] [--tier T] [--limit N] [--cursor C]
    werk runtime states action STATE_ID {pin,unpin,promote,demote,evict} [--target-tier T]
                               [--allow-experimental] [--execute]
    werk runtime states prune  (--id ID ... | --all | --model-id/--tier/--older-than-unix-ms)
                               [--execute]
    werk runtime experts list  [--model-id M] [--tier T] [--limit N] [--cursor C] [--allow-experimental]
    werk runtime experts action {prefetch,pin,unpin,evict} --model-id M --expert-id E ...
                               [--target-tier T] [--allow-experimental] [--execute]
    werk runtime prefill --model M (--text T | --messages-file F) --handoff-file PATH
                         [--mode …] [--reuse …] [--ttl-seconds N] [--pin] [--[no-]allow-experimental]
    werk runtime decode --handoff-file PATH [--next-handoff-file PATH] [--max-tokens N]
                        [--temperature X] [--top-p X] [--seed N] [--stop S ...] [--allow-experimental]
    werk runtime count-tokens | admission (--request-file F | --text T | --messages-file F)
                        [--model M] [--max-tokens N]
    werk runtime limits [--model M]
    werk runtime reasoning [--model M] [--max-output-tokens N]

Every command takes ``--server URL`` (default ``$WERK_SERVER``, else
``http://127.0.0.1:11434``), ``--timeout SECONDS`` and ``--deployment ID``. The API key
comes from ``WERK_API_KEY`` or, only when stdin is a terminal, a hidden prompt; it is never
accepted on the command line.

Mutations (``states action``, ``states prune``, ``experts action``) are previews
(``dry_run: true``) unless ``--execute`` is given: check the preview, then repeat with
``--execute``.

Handoffs never reach the terminal: ``prefill`` creates ``--handoff-file`` (it must not exist;
created 0600 with ``O_EXCL|O_NOFOLLOW``), writes the handoff there and prints the result with
the handoff replaced by a note. ``decode`` reads the handoff from an owner-only regular file;
a next handoff goes to ``--next-handoff-file`` (created like prefill's) or, when that is not
given, atomically replaces the consumed handoff in ``--handoff-file``.

Success prints pretty JSON on stdout and exits 0. A failure prints
``{"error": {"type", "code", "message", "retryable", "request_id", "status"}}`` on stderr and
exits with the code for its class (the most specific row wins):

====  ===============================  ==================================================
exit  error class                      meaning
====  ===============================  ==================================================
0     —                                success
2     (argparse)                       command-line usage error
3     TransportError                   cannot connect, or the connection failed
4     ClientTimeoutError               the request deadline passed
5     ProtocolViolationError           the answer is not a Werk Protocol 1.x envelope
6     FramingError                     lying Content-Length, broken chunked framing
7     ResponseTooLargeError            response body over 8 MiB
8     RedirectError                    the server answered 3xx (never followed)
9     VersionHeaderMismatchError       version header disagrees with the envelope
10    IncompatibleVersionError         the envelope's protocol version is not consumable
11    RequestTooLargeError             the encoded request exceeds 1 MiB (not sent)
12    InvalidBaseUrlError              ``--server``/``WERK_SERVER`` is not http://HOST:PORT
13    ClientConfigError                bad key, timeout, deployment or state id; unencodable
14    InputError                       invalid local input (values, JSON files)
15    HandoffFileError                 the handoff file cannot be created/read safely
20    InvalidRequestError              server: invalid_request
21    IncompatibleProtocolError        server: incompatible_protocol
22    UnauthorizedError                server: unauthorized
23    ForbiddenError                   server: forbidden
24    NotFoundError                    server: not_found
25    ConflictError                    server: conflict
26    IncompatibleStateError           server: incompatible_state
27    ExpiredHandoffError              server: expired_handoff
28    ExperimentalOptInRequiredError   server: experimental_opt_in_required
29    ResourceExhaustedError           server: resource_exhausted
30    UnsupportedError                 server: unsupported
31    UnavailableError                 server: unavailable
32    CorruptStateError                server: corrupt_state
33    InternalServerError              server: internal
130   KeyboardInterrupt                interrupted
====  ===============================  ==================================================
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import secrets
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

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
)
from werk_host.deployments.durations import MAX_DURATION_S
from werk_host.protocol import (
    DEFAULT_OUTPUT_TOKENS,
    MAX_HANDOFF_BYTES,
    MAX_REQUEST_BYTES,
    AllSelector,
    ChatRequest,
    DecodeRequest,
    ExpertActionKind,
    ExpertActionRequest,
    ExpertListQuery,
    ExpertTier,
    FilterSelector,
    IdsSelector,
    MessagesInput,
    PersistenceMode,
    Policy,
    PrefillRequest,
    PruneRequest,
    ReusePolicy,
    StateActionKind,
    StateActionRequest,
    StateListQuery,
    TextInput,
    Tier,
)

SERVER_ENV = "WERK_SERVER"
KEY_ENV = "WERK_API_KEY"


class InputError(Exception):
    """Invalid local input (flag values, JSON files). Its message never echoes file contents."""

    code = "invalid_input"


class HandoffFileError(Exception):
    """A handoff file could not be created, written or read safely."""

    code = "handoff_file"


EXIT_OK = 0
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

#: Error class -> exit code; the most specific class in an error's MRO wins.
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


# -- output ------------------------------------------------------------------------------
def _emit(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True), flush=True)


def emit_error(error: BaseException) -> None:
    if isinstance(error, WerkClientError):
        body = error.as_dict()
    else:
        body = {
            "type": type(error).__name__,
            "code": getattr(error, "code", "error"),
            "message": str(error),
            "retryable": False,
            "request_id": None,
            "status": None,
        }
    print(json.dumps({"error": body}, indent=2, sort_keys=True), file=sys.stderr, flush=True)


def _dump(value: BaseModel | list[Any]) -> Any:
    if isinstance(value, list):
        return [_dump(v) for v in value]
    return value.model_dump(mode="json")


def _validation_summary(err: ValidationError) -> str:
    parts = []
    for item in err.errors(include_input=False, include_url=False, include_context=False)[:5]:
        loc = ".".join(str(p) for p in item.get("loc", ())) or "value"
        parts.append(f"{loc}: {item.get('msg', 'invalid')}")
    return "; ".join(parts)


def _build(factory: Callable[[], Any]) -> Any:
    """Run a DTO constructor, turning validation errors into :class:`InputError` (no values echoed)."""
    try:
        return factory()
    except ValidationError as err:
        raise InputError(f"invalid input: {_validation_summary(err)}") from None


# -- connection --------------------------------------------------------------------------
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
    server = args.server or os.environ.get(SERVER_ENV) or DEFAULT_SERVER
    return WerkProtocolClient(server, _api_key(), timeout=args.timeout, deployment=args.deployment)


# -- files -------------------------------------------------------------------------------
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _read_input_file(path: str, what: str) -> Any:
    """Read a JSON file (``-`` = stdin), bounded at the protocol's 1 MiB request size."""
    try:
        if path == "-":
            raw = sys.stdin.buffer.read(MAX_REQUEST_BYTES + 1)
        else:
            with open(path, "rb") as handle:
                raw = handle.read(MAX_REQUEST_BYTES + 1)
    except OSError as err:
        raise InputError(f"cannot read the {what}: {err.strerror or type(err).__name__}") from None
    if len(raw) > MAX_REQUEST_BYTES:
        raise InputError(f"the {what} exceeds {MAX_REQUEST_BYTES} bytes")
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InputError(f"the {what} is not valid UTF-8 JSON") from None


class _SecretFile:
    """A new owner-only file: created 0600 with O_EXCL|O_NOFOLLOW, removed again if unused."""

    def __init__(self, path: str) -> None:
        self.path = path
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
        try:
            self.fd: int | None = os.open(path, flags, 0o600)
        except FileExistsError:
            raise HandoffFileError(f"{path} already exists; refusing to overwrite a handoff file") from None
        except OSError as err:
            raise HandoffFileError(f"cannot create {path}: {err.strerror or type(err).__name__}") from None
        try:
            os.fchmod(self.fd, 0o600)
            info = os.fstat(self.fd)
        except OSError as err:
            self.discard()
            raise HandoffFileError(f"cannot secure {path}: {err.strerror or type(err).__name__}") from None
        self._identity = (info.st_dev, info.st_ino)

    def write(self, secret: str) -> None:
        assert self.fd is not None
        data = (secret + "\n").encode("utf-8")
        try:
            view = memoryview(data)
            while view:
                written = os.write(self.fd, view)
                view = view[written:]
            os.fsync(self.fd)
        except OSError as err:
            self.discard()
            raise HandoffFileError(
                f"cannot write {self.path}: {err.strerror or type(err).__name__}; the handoff is lost"
            ) from None
        os.close(self.fd)
        self.fd = None

    def discard(self) -> None:
        """Close and remove the file if it is still the one this object created."""
        if self.fd is None:
            return
        try:
            current = os.lstat(self.path)
            if (current.st_dev, current.st_ino) == self._identity:
                os.unlink(self.path)
        except OSError:
            pass
        finally:
            os.close(self.fd)
            self.fd = None


def _replace_secret_file(path: str, secret: str) -> None:
    """Atomically replace ``path`` with a new owner-only file holding ``secret``."""
    target = Path(path)
    temp = str(target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp"))
    holder = _SecretFile(temp)
    holder.write(secret)
    try:
        os.replace(temp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise HandoffFileError(
            f"cannot replace {path}: {err.strerror or type(err).__name__}; the next handoff is lost"
        ) from None


def read_handoff_file(path: str) -> str:
    """Read a handoff from an owner-only regular file that is not a symbolic link."""
    flags = os.O_RDONLY | _NOFOLLOW | _CLOEXEC | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        raise HandoffFileError(f"cannot open {path}: {err.strerror or type(err).__name__}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise HandoffFileError(f"{path} is not a regular file")
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            raise HandoffFileError(f"{path} is not owned by the current user")
        if info.st_mode & 0o077:
            raise HandoffFileError(f"{path} is readable by others; it must be owner-only (chmod 600)")
        limit = MAX_HANDOFF_BYTES + 2
        raw = os.read(fd, limit + 1)
    except OSError as err:
        raise HandoffFileError(f"cannot read {path}: {err.strerror or type(err).__name__}") from None
    finally:
        os.close(fd)
    if len(raw) > limit:
        raise HandoffFileError(f"{path} is larger than a handoff can be")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HandoffFileError(f"{path} is not UTF-8 text") from None
    if text.endswith("\r\n"):
        text = text[:-2]
    elif text.endswith("\n"):
        text = text[:-1]
    if not text:
        raise HandoffFileError(f"{path} is empty")
    return text


def _handoff_note(path: str) -> str:
    return f"[secret handoff written to {path}; not shown]"


# -- commands ----------------------------------------------------------------------------
def _simple(method: str) -> Callable[[argparse.Namespace], Any]:
    def run(args: argparse.Namespace) -> Any:
        return _dump(getattr(client_for(args), method)())

    return run


def cmd_states_list(args: argparse.Namespace) -> Any:
    query = _build(lambda: StateListQuery(model_id=args.model_id, tier=args.tier, limit=args.limit, cursor=args.cursor))
    return _dump(client_for(args).list_states(query))


def cmd_states_action(args: argparse.Namespace) -> Any:
    request = _build(
        lambda: StateActionRequest(
            action=args.action,
            target_tier=args.target_tier,
            dry_run=not args.execute,
            allow_experimental=args.allow_experimental,
        )
    )
    return _dump(client_for(args).state_action(args.state_id, request))


def cmd_states_prune(args: argparse.Namespace) -> Any:
    filtered = any(v is not None for v in (args.model_id, args.tier, args.older_than_unix_ms))
    selector: Any
    if args.all:
        if filtered or args.ids:
            raise InputError("--all cannot be combined with --id or filter options")
        selector = _build(lambda: AllSelector(kind="all", confirm=True))
    elif args.ids:
        if filtered:
            raise InputError("--id cannot be combined with filter options")
        selector = _build(lambda: IdsSelector(kind="ids", ids=args.ids))
    else:
        if not filtered:
            raise InputError("choose --id, --all, or at least one of --model-id, --tier, --older-than-unix-ms")
        selector = _build(
            lambda: FilterSelector(
                kind="filter", model_id=args.model_id, tier=args.tier, older_than_unix_ms=args.older_than_unix_ms
            )
        )
    request = _build(lambda: PruneRequest(selector=selector, dry_run=not args.execute))
    return _dump(client_for(args).prune_states(request))


def cmd_experts_list(args: argparse.Namespace) -> Any:
    query = _build(
        lambda: ExpertListQuery(
            model_id=args.model_id,
            tier=args.tier,
            limit=args.limit,
            cursor=args.cursor,
            allow_experimental=args.allow_experimental,
        )
    )
    return _dump(client_for(args).list_experts(query))


def cmd_experts_action(args: argparse.Namespace) -> Any:
    request = _build(
        lambda: ExpertActionRequest(
            model_id=args.model_id,
            expert_ids=args.expert_ids,
            action=args.action,
            target_tier=args.target_tier,
            dry_run=not args.execute,
            allow_experimental=args.allow_experimental,
        )
    )
    return _dump(client_for(args).expert_action(request))


def _messages(path: str) -> list[Any]:
    loaded = _read_input_file(path, "messages file")
    if isinstance(loaded, dict) and set(loaded) == {"messages"}:
        loaded = loaded["messages"]
    if not isinstance(loaded, list):
        raise InputError('the messages file must hold a JSON array of messages or {"messages": [...]}')
    return loaded


def cmd_prefill(args: argparse.Namespace) -> Any:
    prefill_input: Any
    if args.messages_file is not None:
        messages = _messages(args.messages_file)
        prefill_input = _build(lambda: MessagesInput(type="messages", messages=messages))
    else:
        prefill_input = _build(lambda: TextInput(type="text", text=args.text))
    policy = None
    if args.mode is not None or args.reuse is not None or args.ttl_seconds is not None or args.pin:
        policy = _build(
            lambda: Policy(
                mode=args.mode or PersistenceMode.AUTO,
                reuse=args.reuse or ReusePolicy.PREFER,
                ttl_seconds=args.ttl_seconds,
                pin=args.pin,
            )
        )
    request = _build(
        lambda: PrefillRequest(
            model_id=args.model, input=prefill_input, policy=policy, allow_experimental=args.allow_experimental
        )
    )
    client = client_for(args)
    holder = _SecretFile(args.handoff_file)
    try:
        result = client.prefill(request)
    except BaseException:
        holder.discard()
        raise
    holder.write(result.handoff.get_secret_value())
    out = result.model_dump(mode="json", exclude={"handoff"})
    out["handoff"] = _handoff_note(args.handoff_file)
    return out


def cmd_decode(args: argparse.Namespace) -> Any:
    handoff = read_handoff_file(args.handoff_file)
    request = _build(
        lambda: DecodeRequest(
            handoff=handoff,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            seed=args.seed,
            stop=args.stop,
            allow_experimental=args.allow_experimental,
        )
    )
    client = client_for(args)
    holder = _SecretFile(args.next_handoff_file) if args.next_handoff_file else None
    try:
        result = client.decode(request)
    except BaseException:
        if holder is not None:
            holder.discard()
        raise
    out = result.model_dump(mode="json", exclude={"handoff"})
    out["handoff"] = None
    if result.handoff is None:
        if holder is not None:
            holder.discard()
    elif holder is not None:
        holder.write(result.handoff.get_secret_value())
        out["handoff"] = _handoff_note(args.next_handoff_file)
    else:
        _replace_secret_file(args.handoff_file, result.handoff.get_secret_value())
        out["handoff"] = _handoff_note(args.handoff_file)
    return out


def _chat_request(args: argparse.Namespace) -> ChatRequest:
    if args.request_file is not None:
        loaded = _read_input_file(args.request_file, "request file")
        if not isinstance(loaded, dict):
            raise InputError("the request file must hold a JSON object (an OpenAI chat request)")
        if args.model is not None:
            loaded["model"] = args.model
        if args.max_tokens is not None:
            loaded["max_tokens"] = args.max_tokens
        return _build(lambda: ChatRequest.model_validate(loaded))  # type: ignore[no-any-return]
    messages: list[Any] = (
        _messages(args.messages_file) if args.messages_file is not None else [{"role": "user", "content": args.text}]
    )
    fields: dict[str, Any] = {"messages": messages}
    if args.model is not None:
        fields["model"] = args.model
    if args.max_tokens is not None:
        fields["max_tokens"] = args.max_tokens
    return _build(lambda: ChatRequest.model_validate(fields))  # type: ignore[no-any-return]


def cmd_count_tokens(args: argparse.Namespace) -> Any:
    return _dump(client_for(args).count_tokens(_chat_request(args)))


def cmd_admission(args: argparse.Namespace) -> Any:
    return _dump(client_for(args).admission(_chat_request(args)))


def cmd_limits(args: argparse.Namespace) -> Any:
    return _dump(client_for(args).chat_limits(args.model))


def cmd_reasoning(args: argparse.Namespace) -> Any:
    return _dump(client_for(args).reasoning(args.model, args.max_output_tokens))


# -- parser ------------------------------------------------------------------------------
def _dispatch(command: Callable[[argparse.Namespace], Any]) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        try:
            result = command(args)
        except (WerkClientError, InputError, HandoffFileError) as err:
            emit_error(err)
            return exit_code_for(err)
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
        _emit(result)
        return EXIT_OK

    return handler


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError("expected a positive integer")
    return value


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected seconds") from None
    if not 0 < value <= MAX_DURATION_S:  # the host's duration bound: a year
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, at most {MAX_DURATION_S:.0f}")
    return value


class RefuseKeyOnArgv(argparse.Action):
    """A key option (``--api-key``) that exists only to refuse it without echoing the value (argv
    lands in shell history and in ``/proc/PID/cmdline``, readable by every local user). ``const``
    says where the key goes instead (default: this client's environment variable or prompt)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        instead = self.const or f"set {KEY_ENV} or answer the prompt"
        parser.error(f"the API key is never read from the command line; {instead}")


def connection_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--api-key", action=RefuseKeyOnArgv, help=argparse.SUPPRESS)
    group = common.add_argument_group("connection")
    group.add_argument("--server", help=f"http://HOST:PORT (default: ${SERVER_ENV} or {DEFAULT_SERVER})")
    group.add_argument("--timeout", type=_timeout, default=DEFAULT_TIMEOUT, help="seconds per request (default 30)")
    group.add_argument("--deployment", help="deployment instance id sent as X-Werk-Deployment")
    return common


def _execute_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--execute", action="store_true", help="act for real; without it the server only previews (dry_run)"
    )


def _experimental_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-experimental", action="store_true", help="opt in to an experimental capability")


def register(subparsers: Any) -> None:
    """Add ``werk runtime …`` to the ``werk`` command's sub-parsers."""
    common = connection_options()
    doc = (__doc__ or "").replace("``", "")
    runtime = subparsers.add_parser(
        "runtime",
        help="drive the Werk Protocol control plane of a running server",
        description="Drive the Werk Protocol 1.0 control plane of a running werk serve. Mutations are "
        "previews unless --execute is given; handoffs only ever live in owner-only files.",
        epilog=doc[doc.find("Success prints") :] if "Success prints" in doc else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = runtime.add_subparsers(dest="runtime_command", required=True, metavar="COMMAND")

    def leaf(parent: Any, name: str, help_text: str, command: Callable[[argparse.Namespace], Any]) -> Any:
        parser = parent.add_parser(name, help=help_text, parents=[common])
        parser.set_defaults(handler=_dispatch(command))
        return parser

    leaf(sub, "info", "runtime info and negotiated limits", _simple("info"))
    leaf(sub, "capabilities", "capability statuses", _simple("capabilities"))
    leaf(sub, "memory", "memory telemetry and accounting", _simple("memory"))
    leaf(sub, "observability", "chat, worker and memory observations", _simple("observability"))
    leaf(sub, "deployments", "deployment inventory, plans and slots", _simple("deployments"))

    states = sub.add_parser("states", help="named runtime states")
    ssub = states.add_subparsers(dest="states_command", required=True, metavar="COMMAND")
    p = leaf(ssub, "list", "one page of states", cmd_states_list)
    p.add_argument("--model-id")
    p.add_argument("--tier", choices=[t.value for t in Tier])
    p.add_argument("--limit", type=_positive_int, default=100)
    p.add_argument("--cursor")
    p = leaf(
        ssub, "action", "pin, unpin, promote, demote or evict one state (preview unless --execute)", cmd_states_action
    )
    p.add_argument("state_id")
    p.add_argument("action", choices=[a.value for a in StateActionKind])
    p.add_argument("--target-tier", choices=[t.value for t in Tier])
    _experimental_flag(p)
    _execute_flag(p)
    p = leaf(ssub, "prune", "remove selected states (preview unless --execute)", cmd_states_prune)
    p.add_argument("--id", dest="ids", action="append", metavar="STATE_ID", help="a state id (repeatable)")
    p.add_argument("--all", action="store_true", help="select every visible state")
    p.add_argument("--model-id")
    p.add_argument("--tier", choices=[t.value for t in Tier])
    p.add_argument("--older-than-unix-ms", type=int)
    _execute_flag(p)

    experts = sub.add_parser("experts", help="MoE expert residency")
    esub = experts.add_subparsers(dest="experts_command", required=True, metavar="COMMAND")
    p = leaf(esub, "list", "one page of expert metadata", cmd_experts_list)
    p.add_argument("--model-id")
    p.add_argument("--tier", choices=[t.value for t in ExpertTier])
    p.add_argument("--limit", type=_positive_int, default=100)
    p.add_argument("--cursor")
    _experimental_flag(p)
    p = leaf(esub, "action", "prefetch, pin, unpin or evict experts (preview unless --execute)", cmd_experts_action)
    p.add_argument("action", choices=[a.value for a in ExpertActionKind])
    p.add_argument("--model-id", required=True)
    p.add_argument(
        "--expert-id",
        dest="expert_ids",
        action="append",
        required=True,
        metavar="EXPERT_ID",
        help="an expert id (repeatable)",
    )
    p.add_argument("--target-tier", choices=[t.value for t in Tier])
    _experimental_flag(p)
    _execute_flag(p)

    p = leaf(sub, "prefill", "prefill input; the handoff goes to an owner-only file", cmd_prefill)
    p.add_argument("--model", required=True, help="installed model id")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="text input")
    source.add_argument("--messages-file", help='JSON file with [{"role", "content"}, ...] ("-" = stdin)')
    p.add_argument("--handoff-file", required=True, help="new file (must not exist) to receive the handoff")
    p.add_argument("--mode", choices=[m.value for m in PersistenceMode])
    p.add_argument("--reuse", choices=[r.value for r in ReusePolicy])
    p.add_argument("--ttl-seconds", type=_positive_int)
    p.add_argument("--pin", action="store_true")
    p.add_argument(
        "--allow-experimental",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="explicit experimental opt-in (omitted: the server's default applies)",
    )

    p = leaf(sub, "decode", "decode from the handoff in an owner-only file", cmd_decode)
    p.add_argument("--handoff-file", required=True, help="owner-only file holding the handoff")
    p.add_argument(
        "--next-handoff-file", help="new file for a next handoff (default: replace the consumed one in --handoff-file)"
    )
    p.add_argument("--max-tokens", type=_positive_int, default=DEFAULT_OUTPUT_TOKENS)
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-p", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", help="stop string (repeatable)")
    _experimental_flag(p)

    for name, help_text, command in (
        ("count-tokens", "exact native input token count of a chat request", cmd_count_tokens),
        ("admission", "planning budget of a chat request", cmd_admission),
    ):
        p = leaf(sub, name, help_text, command)
        chat_source = p.add_mutually_exclusive_group(required=True)
        chat_source.add_argument("--request-file", help='JSON OpenAI chat request ("-" = stdin)')
        chat_source.add_argument("--text", help="a single user message")
        chat_source.add_argument("--messages-file", help="JSON array of chat messages")
        p.add_argument("--model")
        p.add_argument("--max-tokens", type=_positive_int)

    p = leaf(sub, "limits", "context, output and concurrency limits", cmd_limits)
    p.add_argument("--model")
    p = leaf(sub, "reasoning", "reasoning profile and tiers", cmd_reasoning)
    p.add_argument("--model")
    p.add_argument("--max-output-tokens", type=_positive_int, default=DEFAULT_OUTPUT_TOKENS)
