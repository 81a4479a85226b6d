"""``GET /werk/v1/states?limit=100`` latency with 100 vs 10,000 states for one principal.

Two Werk hosts on real waitress servers (loopback, ephemeral ports), one per catalog size,
each queried over its own keep-alive connection. Runs are interleaved; the script prints
both medians and the ratio large/small (target <= 2: a page must not cost a scan of the
whole catalog). See ``bench/catalog_scale_store.py`` for the store-level breakdown.

    .venv/bin/python bench/catalog_scale.py [--small 100] [--large 10000] [--rounds 41] [--dir DIR]
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.catalog_scale_store import populate  # noqa: E402
from werk_host.testing.hosts import make_host, running  # noqa: E402

KEY = "sk-werk-bench-catalog"


def page_ms(conn: http.client.HTTPConnection) -> float:
    start = time.perf_counter()
    conn.request("GET", "/werk/v1/states?limit=100", headers={"Authorization": f"Bearer {KEY}"})
    response = conn.getresponse()
    body = response.read()
    elapsed = (time.perf_counter() - start) * 1000.0
    assert response.status == 200 and body.count(b'"id":"st_') == 100, body[:200]
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=100)
    ap.add_argument("--large", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--dir", default=None, help="where to build the catalogs (e.g. /dev/shm)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="werk-bench-catalog-", dir=args.dir))
    hosts = {}
    for label, n in (("small", args.small), ("large", args.large)):
        home = work / label
        host = make_host(home, api_keys=(KEY,))
        principal = host.auth.authenticate(KEY)
        assert principal is not None
        started = time.perf_counter()
        populate(home / "runtime-state" / "v1", n, principal.id)
        print(f"populated {n} states in {time.perf_counter() - started:.1f}s", file=sys.stderr)
        hosts[label] = host
    samples: dict[str, list[float]] = {"small": [], "large": []}
    with running(hosts["small"]) as small_url, running(hosts["large"]) as large_url:
        conns = {
            label: http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=60)
            for label, url in (("small", small_url), ("large", large_url))
        }
        for label in conns:  # warm: first page builds the per-principal index
            page_ms(conns[label])
        for _ in range(args.rounds):
            for label in ("small", "large"):
                samples[label].append(page_ms(conns[label]))
        for conn in conns.values():
            conn.close()
    small, large = statistics.median(samples["small"]), statistics.median(samples["large"])
    print(f"GET /werk/v1/states?limit=100 median over {args.rounds} interleaved runs:")
    print(f"  {args.small:>6} states: {small:7.2f} ms")
    print(f"  {args.large:>6} states: {large:7.2f} ms")
    print(f"RATIO large/small = {large / small:.2f}  (target <= 2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
