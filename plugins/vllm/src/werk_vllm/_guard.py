"""The process-group guard Werk runs ``vllm serve`` under.

Run as ``python -I -S _guard.py PARENT_PID PROGRAM [ARG...]`` (standard library only). Werk's
:class:`~werk_host.backends.managed.ManagedProcess` makes this guard the leader of a new process
group with a parent-death SIGKILL. That covers one process, but ``vllm serve`` is several: its
engine core and workers are children of the API server and would survive Werk's death (a
SIGKILL of ``werk serve`` leaves them running). So the guard:

* turns its parent-death signal into SIGTERM (Linux ``prctl``) and exits at once if its parent
  is no longer ``PARENT_PID`` (Werk died before the guard was ready; nothing was started);
* runs ``PROGRAM`` as its child, in its own process group, inheriting streams, environment and
  working directory;
* when its parent dies (the signal arrives, or its parent pid changes), SIGKILLs its whole
  process group: vLLM and everything it started, the guard included;
* otherwise exits like ``PROGRAM`` (its status, or ``128 + N`` when signal N killed it). Werk
  stops the group with signals to the group, which reach vLLM directly; the guard itself waits.

On a platform without ``prctl(PR_SET_PDEATHSIG)`` it simply executes ``PROGRAM`` in its place.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
POLL_S = 0.1


def _rearm_parent_death(sig: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    return int(prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)) == 0


def main(argv: list[str]) -> int:
    parent, program = int(argv[0]), argv[1:]
    pending: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: pending.append(signum))
    if not _rearm_parent_death(signal.SIGTERM):
        os.execvp(program[0], program)
    if os.getppid() != parent:
        return 1  # Werk is already gone
    child = subprocess.Popen(program)
    while True:
        if os.getppid() != parent:
            os.killpg(0, signal.SIGKILL)  # Werk died: take vLLM and all it started along
        rc = child.poll()
        if rc is not None:
            return rc if rc >= 0 else 128 - rc
        pending.clear()  # a stop signalled to the group: vLLM got it too and shuts down
        time.sleep(POLL_S)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
