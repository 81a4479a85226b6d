"""``werk run MODEL [PROMPT]``: one streamed answer (docs/chat.md, "werk run"; docs/cli.md).

Also the options and startup that ``werk chat`` shares (:func:`add_session_options`,
:func:`open_session`): where the model runs (local by default, ``--server URL``/``WERK_SERVER``
with the key from ``WERK_API_KEY``; a URL without a scheme is taken as ``http://``), sampling
(an answer is at most ``--max-tokens`` tokens, default :data:`DEFAULT_MAX_TOKENS` lowered to
the model's output ceiling or half its context when smaller: :func:`answer_length`),
``--persistence``/``--session`` and the startup lines saying whether native cache reuse is
available, verified or unverified.

Output contract: the answer goes to stdout as it is generated (``--json``: one JSON object once
it is complete); everything else (startup lines, warnings, ``--verbose`` diagnostics, errors)
to stderr. PROMPT may come before or after the options. A failure is one line
``werk: <problem> (<fix>)`` (the JSON error object under ``--json``) and a non-zero exit status
(2 for a request or usage error, 1 for anything else, 130 after Ctrl-C).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

from werk_host.backends.managed import install_signal_cleanup
from werk_host.chat.archive import DEFAULT_SESSION, SessionDir
from werk_host.chat.session import ChatSession, Sampling
from werk_host.chat.stream import one_line
from werk_host.chat.transport import LocalTransport, RemoteTransport, Transport
from werk_host.cli.arguments import KEY_ENV, non_negative
from werk_host.cli.connection import with_scheme
from werk_host.cli.output import add_json_flag, fail, wants_json
from werk_host.client import WerkClientError, WerkProtocolClient
from werk_host.errors import ErrorCode, WerkError
from werk_host.models import parse_param
from werk_host.paths import PrivateDirError, werk_home
from werk_host.protocol import ChatLimits

#: Environment variables naming the default server and its key.
SERVER_ENV = "WERK_SERVER"
#: Tokens an answer may have when ``--max-tokens`` is not given (lowered to the model's output
#: ceiling and half its context when those are smaller: :func:`answer_length`).
DEFAULT_MAX_TOKENS = 512
#: Seconds the startup question for the server's output ceiling may take.
LIMITS_TIMEOUT_S = 10.0
#: The fix printed with a server that cannot be reached (docs/cli.md).
REACH_FIX = f"start it with `werk serve`, or pass --server URL or set {SERVER_ENV}"


@dataclass
class Console:
    """Where a command's non-answer output goes (stderr)."""

    verbose: bool = False
    err: TextIO = field(default_factory=lambda: sys.stderr)

    def note(self, message: str) -> None:
        """A ``--verbose`` diagnostic."""
        if self.verbose:
            self.say(f"[werk] {message}")

    def warn(self, message: str) -> None:
        self.say(f"werk: warning: {message}")

    def say(self, message: str) -> None:
        self.err.write(message + "\n")
        self.err.flush()


class _QuietInterrupts(logging.Filter):
    """Drop log records about a Ctrl-C (the command reports the interruption itself)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, KeyboardInterrupt)


def setup_process(verbose: bool) -> None:
    """Plain stderr logging (warnings, or info with ``--verbose``) and child cleanup on SIGTERM
    and SIGHUP: every backend process this command started is stopped and reaped before the
    signal ends it (Ctrl-C is a ``KeyboardInterrupt`` the commands handle themselves)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("werk: %(levelname)s: %(message)s"))
    handler.addFilter(_QuietInterrupts())
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler], force=True)
    signals = [signal.SIGTERM] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])
    install_signal_cleanup(signals)


def _positive(text: str) -> int:
    value = int(text) if text.isdigit() else 0
    if value < 1:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 2.0:
        raise argparse.ArgumentTypeError("must be a number from 0 to 2")
    return value


def _seed(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be an integer") from None


def add_session_options(p: argparse.ArgumentParser) -> None:
    """The options ``werk run`` and ``werk chat`` share."""
    p.add_argument("model", metavar="MODEL", help="a registered model name or a model file (with --server: its id)")
    p.add_argument(
        "--server",
        metavar="URL",
        default=os.environ.get(SERVER_ENV) or None,
        help=f"use a running werk serve (http://HOST:PORT, or HOST:PORT; default ${SERVER_ENV}); key from ${KEY_ENV}",
    )
    p.add_argument("--session", metavar="NAME", help="keep the conversation in session NAME (implies --persistence)")
    p.add_argument("--persistence", action="store_true", help=f"keep the conversation (session {DEFAULT_SESSION!r})")
    p.add_argument("--system", help="system message")
    p.add_argument(
        "--max-tokens",
        type=_positive,
        metavar="N",
        help=f"most tokens per answer (default {DEFAULT_MAX_TOKENS}, lowered to the model's output ceiling "
        "or half its context when smaller; an N above the ceiling is refused)",
    )
    p.add_argument("--temperature", type=_temperature)
    p.add_argument("--seed", type=_seed)
    p.add_argument(
        "--warmup-tokens",
        type=non_negative,
        default=0,
        help="local backends: 0 (default) skips the native synthetic warmup; N > 0 enables it where offered",
    )
    p.add_argument("--backend", help="local: the backend id or plugin to use (default: the model's or first fitting)")
    p.add_argument("--backend-option", action="append", metavar="PLUGIN.KEY=VALUE", help="local backend setting")
    p.add_argument("--home", help="WERK_HOME (default: $WERK_HOME or ~/.werk)")
    p.add_argument("-v", "--verbose", action="store_true", help="phase diagnostics on stderr")


def backend_options(items: list[str] | None) -> dict[str, dict[str, object]]:
    options: dict[str, dict[str, object]] = {}
    for item in items or []:
        plugin, _, rest = item.partition(".")
        key, value = parse_param(rest)
        options.setdefault(plugin, {})[key] = value
    return options


def _model_limits(transport: Transport) -> ChatLimits | None:
    """The model's limits as the server (or the local backend) reports them; ``None`` when they
    cannot be learned (the request itself then says what is wrong)."""
    try:
        if isinstance(transport, LocalTransport):
            return transport.fleet.hooks.chat_limits(transport.adapter, None)
        if isinstance(transport, RemoteTransport):
            key = os.environ.get(KEY_ENV) or None
            client = WerkProtocolClient(transport.endpoint.url, key, timeout=LIMITS_TIMEOUT_S)
            return client.chat_limits(transport.model)
    except (WerkError, WerkClientError, OSError):
        return None
    return None


def answer_length(args: argparse.Namespace, transport: Transport, console: Console) -> int:
    """``--max-tokens`` as given; else :data:`DEFAULT_MAX_TOKENS`, lowered to the model's output
    ceiling and to half its per-request context when those are smaller (a server refuses a
    request whose output is above the ceiling, or whose input plus output exceeds the context:
    docs/chat.md, "Answer length")."""
    if args.max_tokens is not None:
        return int(args.max_tokens)
    limits = _model_limits(transport)
    length, why = DEFAULT_MAX_TOKENS, "the default"
    if limits is not None and limits.max_output_tokens is not None and limits.max_output_tokens < length:
        length, why = limits.max_output_tokens, "the model's output ceiling"
    if limits is not None and limits.context_tokens is not None and max(1, limits.context_tokens // 2) < length:
        length, why = max(1, limits.context_tokens // 2), "half the model's context"
    console.note(f"answer length: at most {length} tokens ({why}; --max-tokens N to change)")
    return length


def open_session(args: argparse.Namespace, console: Console) -> ChatSession:
    """Lock the session (if any), start or reach the model, load the conversation and say what
    native cache reuse can do. Nothing is left running or locked when it raises."""
    home = werk_home(args.home)
    name = args.session or (DEFAULT_SESSION if args.persistence else None)
    store = SessionDir(home, name) if name is not None else None  # fail fast when it is in use
    try:
        transport: Transport
        if args.server:
            if args.warmup_tokens or args.backend or args.backend_option:
                raise WerkError(
                    ErrorCode.INVALID_REQUEST, "--warmup-tokens, --backend and --backend-option belong to werk serve"
                )
            url = with_scheme(args.server)  # HOST:PORT alone means http://
            transport = RemoteTransport(url, args.model, api_key=os.environ.get(KEY_ENV) or None)
        else:
            transport = LocalTransport(
                home,
                args.model,
                backend=args.backend,
                backend_options=backend_options(args.backend_option),
                warmup_tokens=args.warmup_tokens,
            )
    except BaseException:
        if store is not None:
            store.close()
        raise
    try:
        sampling = Sampling(answer_length(args, transport, console), args.temperature, args.seed)
        session = ChatSession(
            transport, sampling, home=home, store=store, system=args.system, note=console.note, warn=console.warn
        )
    except BaseException:
        if store is not None:
            store.close()
        transport.close()
        raise
    for line in transport.diagnostics():
        console.note(line)
    if store is not None:
        kept = f"{session.resumed} messages from its archive" if session.resumed else "a new conversation"
        console.say(f"werk: session {store.name}: {kept}")
        report = session.native_report
        console.say(f"werk: native cache reuse: {report.status.value} ({report.detail})")
    return session


def _fix(err: WerkError, server: str | None) -> tuple[str, str | None]:
    """The one-line message for ``err`` (from a command talking to ``server``, if any) and what
    to do about it; the same wording as the other commands' (docs/cli.md)."""
    message = one_line(err.message)
    if err.code is ErrorCode.UNAUTHORIZED:
        the_server = f"the server at {server}" if server else "the server"
        if os.environ.get(KEY_ENV, "").strip():
            return f"{the_server} did not accept the API key in {KEY_ENV}", f"set {KEY_ENV} to one of its keys"
        return f"{the_server} requires an API key", f"set {KEY_ENV}"
    if err.code is ErrorCode.FORBIDDEN:
        return message, "use a key the server allows this for"
    if message.startswith("cannot reach werk serve"):
        return message, REACH_FIX
    if message.startswith("invalid server URL"):
        return message, f"pass --server http://HOST:PORT or set {SERVER_ENV}"
    if "output tokens" in message:
        return message, "pass a smaller --max-tokens"
    if message.startswith("give a PROMPT") or message == "the prompt is empty":
        return message, 'e.g. werk run MODEL "Hello" or echo Hello | werk run MODEL'
    return message, None


def failure(command: str, err: BaseException, console: Console, args: argparse.Namespace | None = None) -> int:
    """Report ``err`` on one line, ``werk: <problem> (<fix>)`` (the JSON error object under
    ``--json``); the exit status (2: request/usage error, 1: anything else)."""
    fix: str | None = None
    code = "error"
    if isinstance(err, WerkError):
        server = with_scheme(args.server) if args is not None and getattr(args, "server", None) else None
        message, fix = _fix(err, server)
        status, code = 2 if err.code is ErrorCode.INVALID_REQUEST else 1, err.code.value
    elif isinstance(err, PrivateDirError):
        message, status = str(err), 1
    else:
        message, status = f"{type(err).__name__}: {err}", 1
    if args is not None and wants_json(args):
        fail(args, one_line(message), fix, code=code)
    else:
        line = f"werk: {one_line(message).rstrip('.')}" + (f" ({fix})" if fix else "")
        console.say(line)
    return status


def _prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None and args.prompt != "-":
        return str(args.prompt)
    if sys.stdin.isatty():
        raise WerkError(ErrorCode.INVALID_REQUEST, "give a PROMPT argument or pipe one on stdin")
    return sys.stdin.read()


def cmd_run(args: argparse.Namespace) -> int:
    console = Console(verbose=args.verbose)
    setup_process(args.verbose)
    out = sys.stdout
    as_json = wants_json(args)
    try:
        prompt = _prompt(args)
        if not prompt.strip():
            raise WerkError(ErrorCode.INVALID_REQUEST, "the prompt is empty")
        session = open_session(args, console)
    except KeyboardInterrupt:
        return 130
    except (WerkError, OSError, PrivateDirError) as err:
        return failure("run", err, console, args)
    wrote: list[str] = []

    def emit(text: str) -> None:
        wrote.append(text)
        if not as_json:
            out.write(text)
            out.flush()

    try:
        result = session.ask(prompt, emit)
    except KeyboardInterrupt:
        return 130
    except (WerkError, OSError) as err:
        return failure("run", err, console, args)
    finally:
        if not as_json and wrote and not wrote[-1].endswith("\n"):
            out.write("\n")
            out.flush()
        session.close()
    if result.interrupted:
        return 130
    if result.error is not None:
        return failure("run", WerkError(ErrorCode.UNAVAILABLE, result.error), console, args)
    if not result.complete:
        return failure(
            "run", WerkError(ErrorCode.UNAVAILABLE, "the response ended before it was complete"), console, args
        )
    if as_json:
        doc = {
            "model": session.transport.model,
            "text": result.text,
            "finish_reason": result.finish_reason,
            "usage": result.usage,
        }
        print(json.dumps(doc, indent=2, sort_keys=True), flush=True)
    return 0


class _PromptAnywhere(argparse.ArgumentParser):
    """``werk run``'s parser: PROMPT may also follow the options (``werk run MODEL --server URL
    "hi"``). argparse fills the optional PROMPT (with nothing) as soon as it reads MODEL, so a
    prompt after the options comes back as the one leftover word; it is taken as PROMPT."""

    def parse_known_args(  # type: ignore[override]
        self, args: list[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if getattr(parsed, "prompt", None) is None and extras and (extras[0] == "-" or not extras[0].startswith("-")):
            parsed.prompt = extras.pop(0)
        return parsed, extras


def register(subparsers: Any) -> None:
    """Add ``werk run`` to the ``werk`` parser."""
    p = subparsers.add_parser(
        "run",
        help="one answer to PROMPT (or stdin), streamed to stdout",
        description="One answer to PROMPT (before or after the options; '-' or none: stdin), streamed to "
        f"stdout. With --server URL (or ${SERVER_ENV}) through a running werk serve, key from ${KEY_ENV}.",
        epilog="exit status: 0 answered, 1 failed (server unreachable, key refused, backend failed), "
        "2 request or usage error, 130 interrupted (docs/cli.md)",
    )
    p.__class__ = _PromptAnywhere  # PROMPT after the options, too
    add_session_options(p)
    p.add_argument("prompt", nargs="?", metavar="PROMPT", help="the prompt (default, or '-': read stdin)")
    add_json_flag(p)
    p.set_defaults(handler=cmd_run)
