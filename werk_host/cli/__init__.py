"""The ``werk`` command (:mod:`werk_host.cli.commands`): serve, run, chat, plugins, models, cache
and runtime sub-commands.

:func:`main` first lets ``werk serve``, ``werk run`` and ``werk chat`` start their remembered
backend child (:func:`werk_host.backends.launch.prestart`), then imports the commands: the child
loads its model while the host is imported (docs/operations.md, "Remembered launches"). Nothing
else is imported before that. ``werk serve`` runs its start with the cyclic garbage collector
paused (:func:`start_collecting`, once it listens): the start allocates ~90,000 objects and frees
few, and the collector's passes over them were ~12 % of its CPU (docs/operations.md, "Start-up").
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Mapping, Sequence

#: The environment ``werk serve`` reads its listen address from when the flags are absent.
PORT_ENV, HOST_ENV = "WERK_PORT", "WERK_HOST"
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 11434


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``werk`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    from werk_host.backends.launch import command_of, prestart

    words = sys.argv[1:] if argv is None else argv
    if command_of(words) != "serve":
        prestart(words)
    else:
        gc.disable()  # until it listens (module docstring)
        if (listen := _listen_address(words, os.environ)) is not None:  # else: the start ends at once
            prestart(words, listen=listen)
    from werk_host.cli.commands import main as run

    return run(argv)


def start_collecting() -> None:
    """The start is over: the cyclic garbage collector runs again, the start's objects frozen out
    of its passes (``gc.freeze``: they live as long as the host). A no-op when it ran anyway."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def _listen_address(words: Sequence[str], environ: Mapping[str, str]) -> tuple[str, int] | None:
    """Where ``werk serve words`` will listen (``werk_host.cli.serve.listen_address`` decides it
    once the command is parsed); ``None`` when the words do not say it plainly."""
    given: dict[str, str] = {}
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        if name in ("--host", "--port"):
            given[name] = value if eq else (words[i + 1] if i + 1 < len(words) else "")
    host = given.get("--host") or environ.get(HOST_ENV, "").strip() or DEFAULT_HOST
    port = given.get("--port") or environ.get(PORT_ENV, "").strip() or str(DEFAULT_PORT)
    return (host, int(port)) if port.isdigit() and int(port) <= 65535 else None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
