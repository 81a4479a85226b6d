"""Watchdog wrapper for platforms without a parent-death signal (see :mod:`werk_host.backends.child`).

Run as ``python -I -S _watchdog.py FD PROGRAM [ARG...]`` (standard library only, so it needs
neither ``site`` nor the Werk package). It starts ``PROGRAM`` as its own child, inheriting the
standard streams, environment and working directory, and then:

* reads ``FD``, the read end of a pipe whose write end only the spawning process holds: at end
  of file (the spawner closed it, or died by any means, SIGKILL included) the program is killed;
* forwards SIGTERM, SIGINT and SIGHUP to the program;
* exits like the program: with its status, or by re-raising the signal that killed it.

The program is only ever signalled while it is not yet reaped, so its pid cannot have been
reused by an unrelated process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

POLL_S = 0.05
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def main(argv: list[str]) -> int:
    """Run ``argv[1:]`` under the watch of pipe fd ``argv[0]``; returns the exit status to use."""
    fd, program = int(argv[0]), argv[1:]
    lock = threading.Lock()  # reaping and signalling the program never interleave
    pending: list[int] = []

    def remember(signum: int, _frame: object) -> None:
        pending.append(signum)  # acted on by the main loop, under the lock

    for sig in FORWARDED:
        signal.signal(sig, remember)
    child = subprocess.Popen(program)

    def watch() -> None:
        while os.read(fd, 1):
            pass
        with lock:
            if child.returncode is None:
                child.kill()

    threading.Thread(target=watch, name="werk-watchdog", daemon=True).start()
    while True:
        with lock:
            if child.poll() is not None:
                break
            while pending:
                child.send_signal(pending.pop(0))
        time.sleep(POLL_S)
    rc = child.returncode
    if rc < 0:
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP keep their default anyway
            signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
        return 128 - rc  # a signal whose default is to be ignored
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
