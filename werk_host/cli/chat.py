"""``werk chat MODEL``: an interactive terminal chat (docs/chat.md, "werk chat").

Line editing and history come from the standard library's ``readline`` where it exists. Lines
starting with ``/`` are commands (:data:`HELP`); anything else is sent as the next user message
and the answer is streamed as it is generated. Ctrl-C while an answer streams stops that
generation (the request is closed, which cancels it) and returns to the prompt; Ctrl-C at the
prompt clears the line; Ctrl-D or ``/exit`` ends the chat. SIGTERM and SIGHUP stop the backend
processes this command started before it ends (:func:`werk_host.cli.run.setup_process`).

While an answer streams, keys typed on the terminal are neither echoed into the answer nor kept:
echo is off for the turn and input typed ahead is discarded when it ends (:func:`_quiet_keys`;
Ctrl-C still interrupts). An answer is at most ``--max-tokens`` tokens (default 512, lowered to
the model's output ceiling or half its context: :func:`werk_host.cli.run.answer_length`). Errors
are one line ``werk: <problem> (<fix>)`` (docs/cli.md, "werk chat").
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from typing import Any, Final, TextIO

from werk_host.chat.archive import check_session_name
from werk_host.chat.session import ChatSession
from werk_host.cli.run import Console, add_session_options, failure, open_session, setup_process
from werk_host.errors import ErrorCode, WerkError
from werk_host.paths import PrivateDirError

PROMPT: Final = ">>> "
HELP: Final = """\
/help        this list
/reset       forget the conversation so far (the system message stays)
/save NAME   keep the conversation in session NAME from now on
/exit        leave (also /quit or Ctrl-D); Ctrl-C stops an answer while it streams"""


def _line_editing() -> None:
    """Use ``readline`` for line editing and in-memory history when the platform has it."""
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401  (importing it is what enables editing in input())


@contextlib.contextmanager
def _quiet_keys(stream: TextIO) -> Iterator[None]:
    """While the body runs, the terminal on ``stream`` does not echo what is typed; when it ends,
    whatever was typed meanwhile is discarded (``TCSAFLUSH``) and the settings are restored, so
    the next prompt starts empty. Not a terminal, or no ``termios``: nothing changes."""
    try:
        import termios

        fd = stream.fileno()
        saved = termios.tcgetattr(fd) if stream.isatty() else None
    except (ImportError, OSError, ValueError):
        saved = None
    if saved is None:
        yield
        return
    quiet = list(saved)
    quiet[3] &= ~(termios.ECHO | termios.ECHONL)
    try:
        termios.tcsetattr(fd, termios.TCSANOW, quiet)
    except termios.error:
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(termios.error):
            termios.tcsetattr(fd, termios.TCSAFLUSH, saved)


def _command(session: ChatSession, line: str, console: Console, args: argparse.Namespace) -> bool:
    """Run a ``/`` command; ``False`` when the chat should end."""
    word, _, rest = line.partition(" ")
    if word in ("/exit", "/quit"):
        return False
    if word == "/reset":
        session.reset()
        console.say("werk: conversation cleared")
    elif word == "/save":
        name = rest.strip()
        try:
            check_session_name(name)
            report = session.save_as(name)
        except (WerkError, OSError, PrivateDirError) as err:
            failure("chat", err, console, args)
            return True
        console.say(f"werk: saved as session {name}; native cache reuse: {report.status.value} ({report.detail})")
    elif word == "/help":
        console.say(HELP)
    else:
        console.say(f"werk: unknown command {word}\n{HELP}")
    return True


def _turn(session: ChatSession, line: str, console: Console, args: argparse.Namespace) -> None:
    out = sys.stdout

    def emit(text: str) -> None:
        out.write(text)
        out.flush()

    try:
        with _quiet_keys(sys.stdin):
            result = session.ask(line, emit)
    except (WerkError, OSError) as err:
        failure("chat", err, console, args)
        return
    out.write("\n")
    out.flush()
    if result.interrupted:
        console.say("werk: [interrupted]")
    elif result.error is not None:
        failure("chat", WerkError(ErrorCode.UNAVAILABLE, result.error), console, args)
    elif not result.complete:
        failure("chat", WerkError(ErrorCode.UNAVAILABLE, "the response ended before it was complete"), console, args)


def cmd_chat(args: argparse.Namespace) -> int:
    console = Console(verbose=args.verbose)
    setup_process(args.verbose)
    try:
        session = open_session(args, console)
    except KeyboardInterrupt:
        return 130
    except (WerkError, OSError, PrivateDirError) as err:
        return failure("chat", err, console, args)
    _line_editing()
    console.say(f"werk: chatting with {session.transport.description}; /help for commands")
    try:
        while True:
            try:
                line = input(PROMPT).strip()
            except EOFError:
                sys.stdout.write("\n")
                break
            except KeyboardInterrupt:
                sys.stdout.write("\n")
                continue
            if not line:
                continue
            if line.startswith("/"):
                if not _command(session, line, console, args):
                    break
                continue
            _turn(session, line, console, args)
    finally:
        session.close()
    return 0


def register(subparsers: Any) -> None:
    """Add ``werk chat`` to the ``werk`` parser."""
    p = subparsers.add_parser(
        "chat",
        help="interactive terminal chat with MODEL",
        description="An interactive terminal chat with MODEL (/help inside for commands). With --server URL "
        "(or $WERK_SERVER) through a running werk serve, key from $WERK_API_KEY. Keys typed while an answer "
        "streams are not echoed and are discarded. For scripts, use werk run --json.",
        epilog="exit status: 0 after /exit or Ctrl-D, 1 the model could not be started or reached, "
        "2 a usage error, 130 interrupted while starting (docs/cli.md)",
    )
    add_session_options(p)
    p.set_defaults(handler=cmd_chat)
