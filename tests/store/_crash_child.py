"""Child process for the crash and concurrency tests (run as a script, not collected).

``_crash_child.py ROOT PRINCIPAL SEED MODE`` where MODE is ``loop`` (commit until killed),
``count:N`` (commit N states, then exit), ``reconcile:SECONDS`` (reconcile and list in a
loop) or ``slow`` (one commit whose payload stream pauses after its first chunk, printing
``streaming``, until another stdin line arrives). It prints ``ready`` after its imports and starts only when it reads ``go`` on
stdin. After every commit returns it prints ``ack <id> <seed> <size>`` and flushes, so
every complete printed line is an acknowledged commit.

``_crash_child.py zygote ROOT PRINCIPAL ACKDIR`` imports once and then, for every
``fork SEED`` line on stdin, forks a fresh child process that commits in a loop (acks
appended to ``ACKDIR/SEED.acks`` with one ``write`` per line), prints ``pid <pid>``, waits
for it and prints ``exit <pid> <wait status>``. Forking keeps interpreter start-up out of
the kill loop, so hundreds of SIGKILLs fit in the test budget.
"""

from __future__ import annotations

import io
import os
import random
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

from helpers import payload_for  # type: ignore[import-not-found]

from werk_host.store import StateStore


def commit_loop(store: StateStore, principal: str, base: int, limit: int | None, emit: Callable[[str], None]) -> None:
    rng = random.Random(base)
    i = 0
    while limit is None or i < limit:
        seed = base * 1_000_000 + i
        roll = rng.random()
        size = rng.randint(0, 20_000) if roll < 0.8 else rng.randint(0, 300_000) if roll < 0.95 else 3 << 20
        rec = store.commit(
            principal,
            model_id="crash-model",
            backend="test",
            compat_key={"gen": str(base)},
            payload=io.BytesIO(payload_for(seed, size)),
            adapter_meta={"seed": seed, "size": size},
            pinned=rng.random() < 0.2,
        )
        emit(f"ack {rec.id} {seed} {size}\n")
        if rng.random() < 0.2:
            store.set_pinned(principal, rec.id, not rec.pinned)
        i += 1


def zygote(root: Path, principal: str, ackdir: Path) -> int:
    for line in sys.stdin:
        seed = int(line.split()[1])
        pid = os.fork()
        if pid == 0:  # the child: a fresh process with no store state
            code = 1
            try:
                fd = os.open(ackdir / f"{seed}.acks", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                commit_loop(
                    StateStore(root), principal, seed, None, lambda s: None if os.write(fd, s.encode()) else None
                )
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        sys.stdout.write(f"pid {pid}\n")
        sys.stdout.flush()
        _, status = os.waitpid(pid, 0)
        sys.stdout.write(f"exit {pid} {status}\n")
        sys.stdout.flush()
    return 0


def main() -> int:
    if sys.argv[1] == "zygote":
        return zygote(Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
    root, principal, base, mode = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    if sys.stdin.readline() != "go\n":
        return 3
    store = StateStore(root)

    def emit(text: str) -> None:
        out.write(text)
        out.flush()

    if mode == "slow":

        def chunks() -> Iterator[bytes]:
            data = payload_for(base, 3 << 20)
            yield data[: 1 << 20]
            emit("streaming\n")
            sys.stdin.readline()
            yield data[1 << 20 :]

        rec = store.commit(principal, model_id="slow", backend="test", compat_key={}, payload=chunks())
        emit(f"ack {rec.id} {base} {3 << 20}\n")
        return 0
    if mode.startswith("reconcile:"):
        end = time.monotonic() + float(mode.split(":", 1)[1])
        while time.monotonic() < end:
            store.reconcile()
            store.list_states(principal)
        return 0

    commit_loop(store, principal, base, int(mode.split(":", 1)[1]) if mode.startswith("count:") else None, emit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
