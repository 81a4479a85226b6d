"""Child process for the crash and concurrency tests (run as a script, not collected).

Usage: ``_crash_child.py ROOT PRINCIPAL SEED MODE`` where MODE is ``loop`` (commit until
killed), ``count:N`` (commit N states, then exit) or ``reconcile:SECONDS`` (reconcile and
list in a loop). After every commit returns it prints ``ack <id> <seed> <size>`` and
flushes, so every printed line is an acknowledged commit.
"""

from __future__ import annotations

import io
import random
import sys
import time
from pathlib import Path

from helpers import payload_for  # type: ignore[import-not-found]

from werk_host.store import StateStore


def main() -> int:
    root, principal, base, mode = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    store = StateStore(root)
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    if mode.startswith("reconcile:"):
        end = time.monotonic() + float(mode.split(":", 1)[1])
        while time.monotonic() < end:
            store.reconcile()
            store.list(principal)
        return 0
    limit = int(mode.split(":", 1)[1]) if mode.startswith("count:") else None
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
            envelope={"gen": str(base)},
            payload=io.BytesIO(payload_for(seed, size)),
            adapter_meta={"seed": seed, "size": size},
            pinned=rng.random() < 0.2,
        )
        out.write(f"ack {rec.id} {seed} {size}\n")
        out.flush()
        if rng.random() < 0.2:
            store.set_pinned(principal, rec.id, not rec.pinned)
        i += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
