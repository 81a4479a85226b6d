"""``werk run MODEL [PROMPT]``: one streamed answer (docs/chat.md, "werk run").

Also the options and startup that ``werk chat`` shares (:func:`add_session_options`,
:func:`open_session`): where the model runs (local by default, ``--server URL``/``WERK_SERVER``
with the key from ``WERK_API_KEY``), sampling, ``--persistence``/``--session`` and the startup
lines saying whether native cache reuse is available, verified or unverified.

Output contract: the answer goes to stdout as it is generated; everything else (startup lines,
warnings, ``--verbose`` diagnostics, errors) to stderr. A failure is one line
``werk run: error: ...`` and a non-zero exit status (2 for a request or usage error, 1 for
anything else, 130 after Ctrl-C).
"""

from __future__ import annotations

import argparse
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
from werk_host.errors import ErrorCode, WerkError
from werk_host.models import parse_param
from werk_host.paths import PrivateDirError, werk_home

#: Environment variables naming the default server and its key.
SERVER_ENV = "WERK_SERVER"
KEY_ENV = "WERK_API_KEY"


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


def non_negative(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError("must be a non-negative integer")
    return int(text)


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
        help=f"use a running werk serve (http://HOST:PORT; default ${SERVER_ENV}); key from ${KEY_ENV}",
    )
    p.add_argument("--session", metavar="NAME", help="keep the conversation in session NAME (implies --persistence)")
    p.add_argument("--persistence", action="store_true", help=f"keep the conversation (session {DEFAULT_SESSION!r})")
    p.add_argument("--system", help="system message")
    p.add_argument("--max-tokens", type=_positive, help="most tokens to generate per answer")
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
            transport = RemoteTransport(args.server, args.model, api_key=os.environ.get(KEY_ENV) or None)
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
        sampling = Sampling(args.max_tokens, args.temperature, args.seed)
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


def failure(command: str, err: BaseException, console: Console) -> int:
    """Report ``err`` on one line; the exit status (2: request/usage error, 1: anything else)."""
    if isinstance(err, WerkError):
        message, status = err.message, 2 if err.code is ErrorCode.INVALID_REQUEST else 1
    elif isinstance(err, PrivateDirError):
        message, status = str(err), 1
    else:
        message, status = f"{type(err).__name__}: {err}", 1
    console.say(f"werk {command}: error: {one_line(message)}")
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
    try:
        prompt = _prompt(args)
        if not prompt.strip():
            raise WerkError(ErrorCode.INVALID_REQUEST, "the prompt is empty")
        session = open_session(args, console)
    except KeyboardInterrupt:
        return 130
    except (WerkError, OSError, PrivateDirError) as err:
        return failure("run", err, console)
    wrote: list[str] = []

    def emit(text: str) -> None:
        wrote.append(text)
        out.write(text)
        out.flush()

    try:
        result = session.ask(prompt, emit)
    except KeyboardInterrupt:
        return 130
    except (WerkError, OSError) as err:
        return failure("run", err, console)
    finally:
        if wrote and not wrote[-1].endswith("\n"):
            out.write("\n")
            out.flush()
        session.close()
    if result.interrupted:
        return 130
    if result.error is not None:
        return failure("run", WerkError(ErrorCode.UNAVAILABLE, result.error), console)
    if not result.complete:
        return failure("run", WerkError(ErrorCode.UNAVAILABLE, "the response ended before it was complete"), console)
    return 0


def register(subparsers: Any) -> None:
    """Add ``werk run`` to the ``werk`` parser."""
    p = subparsers.add_parser("run", help="one answer to PROMPT (or stdin), streamed to stdout")
    add_session_options(p)
    p.add_argument("prompt", nargs="?", metavar="PROMPT", help="the prompt (default, or '-': read stdin)")
    p.set_defaults(handler=cmd_run)
