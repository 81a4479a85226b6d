"""``werk chat MODEL``: an interactive terminal chat (docs/chat.md, "werk chat").

Line editing and history come from the standard library's ``readline`` where it exists. Lines
starting with ``/`` are commands (:data:`HELP`); anything else is sent as the next user message
and the answer is streamed as it is generated. Ctrl-C while an answer streams stops that
generation (the request is closed, which cancels it) and returns to the prompt; Ctrl-C at the
prompt clears the line; Ctrl-D or ``/exit`` ends the chat. SIGTERM and SIGHUP stop the backend
processes this command started before it ends (:func:`werk_host.cli.run.setup_process`).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any, Final

from werk_host.chat.archive import check_session_name
from werk_host.chat.session import ChatSession
from werk_host.cli.run import Console, add_session_options, failure, open_session, setup_process
from werk_host.errors import WerkError
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


def _command(session: ChatSession, line: str, console: Console) -> bool:
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
            failure("chat", err, console)
            return True
        console.say(f"werk: saved as session {name}; native cache reuse: {report.status.value} ({report.detail})")
    elif word == "/help":
        console.say(HELP)
    else:
        console.say(f"werk: unknown command {word}\n{HELP}")
    return True


def _turn(session: ChatSession, line: str, console: Console) -> None:
    out = sys.stdout

    def emit(text: str) -> None:
        out.write(text)
        out.flush()

    try:
        result = session.ask(line, emit)
    except (WerkError, OSError) as err:
        failure("chat", err, console)
        return
    out.write("\n")
    out.flush()
    if result.interrupted:
        console.say("werk: [interrupted]")
    elif result.error is not None:
        console.say(f"werk chat: error: {result.error}")
    elif not result.complete:
        console.say("werk chat: error: the response ended before it was complete")


def cmd_chat(args: argparse.Namespace) -> int:
    console = Console(verbose=args.verbose)
    setup_process(args.verbose)
    try:
        session = open_session(args, console)
    except KeyboardInterrupt:
        return 130
    except (WerkError, OSError, PrivateDirError) as err:
        return failure("chat", err, console)
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
                if not _command(session, line, console):
                    break
                continue
            _turn(session, line, console)
    finally:
        session.close()
    return 0


def register(subparsers: Any) -> None:
    """Add ``werk chat`` to the ``werk`` parser."""
    p = subparsers.add_parser("chat", help="interactive terminal chat with MODEL")
    add_session_options(p)
    p.set_defaults(handler=cmd_chat)
