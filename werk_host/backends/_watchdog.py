"""The guard a managed child runs under when the kernel's parent-death signal is not enough
(see :mod:`werk_host.backends.child`, guards ``"watchdog"`` and ``"group"``).

Run as ``python -I -S _watchdog.py [--group] FD PROGRAM [ARG...]`` (standard library only, so
it needs neither ``site`` nor the Werk package). :func:`~werk_host.backends.child.spawn` starts
it as the leader of a new session, hence of the process group whose id is its pid. It starts
``PROGRAM`` as its own child, inheriting the standard streams, environment and working
directory, and reads ``FD``, the read end of a pipe whose write end only the spawning process
holds: end of file means that process closed it or died by any means, SIGKILL included. Then:

* without ``--group`` (platforms without a parent-death signal): the program is killed; SIGTERM,
  SIGINT and SIGHUP sent to the guard are forwarded to the program;
* with ``--group`` (engines that start processes of their own, e.g. ``vllm serve`` with its
  engine core and workers, which a parent-death signal on one process would not reach): the
  whole process group is SIGKILLed, the program, everything it started and the guard itself.
  Stop signals are not forwarded: the host stops the group with signals to the group, which
  reach the program directly, and the guard waits for it to exit. A guard that does not lead
  its process group (it was not started by ``spawn``) never signals the group: it kills the
  program alone.

Either way it exits like the program: with its status, or by re-raising the signal that killed
it. The program is only ever signalled while it is not yet reaped, so its pid cannot have been
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
GROUP_FLAG = "--group"


def main(argv: list[str]) -> int:
    """Run the program of ``argv`` (``[--group] FD PROGRAM...``) under the watch of pipe fd ``FD``;
    returns the exit status to use."""
    group = bool(argv) and argv[0] == GROUP_FLAG
    if group:
        argv = argv[1:]
    fd, program = int(argv[0]), argv[1:]
    lock = threading.Lock()  # reaping and signalling the program never interleave
    pending: list[int] = []

    def remember(signum: int, _frame: object) -> None:
        pending.append(signum)  # acted on by the main loop, under the lock

    for sig in FORWARDED:
        signal.signal(sig, remember)
    child = subprocess.Popen(program)
    leader = os.getpgrp() == os.getpid()

    def watch() -> None:
        while os.read(fd, 1):
            pass
        with lock:
            if child.returncode is None:
                if group and leader:
                    os.killpg(0, signal.SIGKILL)  # the spawner is gone: take everything it started along
                child.kill()

    threading.Thread(target=watch, name="werk-watchdog", daemon=True).start()
    while True:
        with lock:
            if child.poll() is not None:
                break
            while pending:
                signum = pending.pop(0)
                if not group:  # a group stop reached the program directly
                    child.send_signal(signum)
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
