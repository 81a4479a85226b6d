"""Page latency of ``StateStore.list_states`` (limit 100) with 100 vs 10,000 states for one principal.

A page must not cost a scan of the whole catalog: the store keeps a per-principal sorted
id index validated against the directory's identity, and parses metadata lazily with a
per-(id, file identity) cache. This prints the median latency of interleaved runs of the
first page (the headline ratio large/small, target <= 2) and, for information, a page deep
in the large catalog (cursor at 90%), the cold first page of a fresh store instance (one
directory scan) and one durable commit (which reconciles first) at each size.

Population uses ``durable=False`` and ``audit_batch=1`` purely to build 10,000 states
quickly; the measured operations use the normal code path. Populating and removing 10,000
state directories is dominated by filesystem metadata cost; ``--dir /dev/shm`` is faster
where a tmpfs exists.

    .venv/bin/python bench/catalog_scale_store.py [--small 100] [--large 10000] [--rounds 41] [--dir DIR]
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from werk_host.store import StateStore

PRINCIPAL = "c0ffee" * 8
#: One principal holds the whole large catalog: storage bounds above it (docs/states.md, "Quotas").
MAX_STATES = 1_000_000


def populate(root: Path, n: int, principal: str = PRINCIPAL) -> None:
    store = StateStore(root, durable=False, audit_batch=1, max_states=MAX_STATES, max_states_per_key=MAX_STATES)
    for i in range(n):
        store.commit(
            principal,
            model_id=f"model-{i % 3}",
            backend="llamacpp",
            compat_key={"process_generation": "g1"},
            payload=io.BytesIO(i.to_bytes(8, "big") * 16),
            prompt_fingerprint=f"fp-{i}",
            adapter_meta={"n_tokens": i},
        )


def cold_page(root: Path) -> object:
    """First page from a fresh store instance (no index yet: one directory scan)."""
    return StateStore(root).list_states(PRINCIPAL, limit=100)


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=100)
    ap.add_argument("--large", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--dir", default=None, help="where to build the temporary catalogs")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="werk-bench-", dir=args.dir) as tmp:
        roots = {n: Path(tmp) / f"home-{n}" / "runtime-state" / "v1" for n in (args.small, args.large)}
        for n, root in roots.items():
            t0 = time.perf_counter()
            populate(root, n)
            print(f"populated {n:>6} states in {time.perf_counter() - t0:6.1f} s")
        time.sleep(0.3)  # let directory timestamps age past the index's racy margin

        stores = {
            n: StateStore(root, max_states=MAX_STATES, max_states_per_key=MAX_STATES) for n, root in roots.items()
        }
        middle: dict[int, str] = {}
        for n, store in stores.items():
            ids: list[str] = []
            after = None
            while True:  # warm-up walk; also finds a cursor in the middle
                page, after = store.list_states(PRINCIPAL, limit=100, after=after)
                ids += [r.id for r in page]
                if after is None:
                    break
            assert len(ids) == n, (len(ids), n)
            middle[n] = ids[(len(ids) * 9) // 10 - 1]

        samples: dict[str, dict[int, list[float]]] = {"first": {}, "middle": {}, "cold": {}}
        for _ in range(args.rounds):
            for n, store in stores.items():  # interleaved, so drift hits both sizes alike
                first = partial(store.list_states, PRINCIPAL, limit=100)
                deep = partial(store.list_states, PRINCIPAL, limit=100, after=middle[n])
                cold = partial(cold_page, roots[n])
                samples["first"].setdefault(n, []).append(timed(first))
                samples["middle"].setdefault(n, []).append(timed(deep))
                samples["cold"].setdefault(n, []).append(timed(cold))

        def med(kind: str, n: int) -> float:
            return statistics.median(samples[kind][n]) * 1000

        small, large = args.small, args.large
        print(f"\n{'limit-100 page':<30}{small:>10} states{large:>10} states{'ratio':>10}")
        rows = (
            ("first page, warm store", med("first", small), med("first", large)),
            ("deep page (90%), warm", med("first", small), med("middle", large)),
            ("first page, fresh store", med("cold", small), med("cold", large)),
        )
        for label, a, b in rows:
            print(f"{label:<30}{a:>13.3f} ms{b:>13.3f} ms{b / a:>10.2f}")
        commit_ms: dict[int, float] = {}
        for n, store in stores.items():
            times: list[float] = []
            for i in range(5):
                payload = io.BytesIO(bytes(64 + i))
                t0 = time.perf_counter()
                store.commit(PRINCIPAL, model_id="m", backend="b", compat_key={}, payload=payload)
                times.append(time.perf_counter() - t0)
            commit_ms[n] = statistics.median(times) * 1000
        print(
            f"{'durable commit (info)':<30}{commit_ms[small]:>13.3f} ms{commit_ms[large]:>13.3f} ms"
            f"{commit_ms[large] / commit_ms[small]:>10.2f}"
        )
        ratio = med("first", large) / med("first", small)
        print(f"\npage latency ratio {large} vs {small} states: {ratio:.2f} (target <= 2)")


if __name__ == "__main__":
    main()
