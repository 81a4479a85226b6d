"""Werk's ``/v1`` overhead over vLLM: the same chat request through Werk and straight to its child.

One in-process Werk host (on waitress, like ``werk serve``) manages one ``vllm serve`` on a
generated tiny Hugging Face Llama (``werk_vllm/testing/testmodel.py``, run with the vLLM venv's Python).
Each round sends the same non-streamed chat request (fixed prompt, ``--max-tokens`` output
tokens with ``ignore_eos``, temperature 0, fixed seed) to

* ``werk``   - ``POST {werk}/v1/chat/completions`` with the API key: auth, body bound, routing,
               admission (exact count through vLLM's ``/tokenize``), pooled relay;
* ``direct`` - ``POST {child}/v1/chat/completions`` on the managed vLLM server itself,

in alternating order (ABBA), each over one persistent keep-alive connection, after a warm-up.
Prints medians, p90s, Werk's own share (median difference) and the median ratio werk/direct,
then ``RATIO vllm_proxy_overhead = X (target <= 1.05)``. The default request generates 64
tokens; any Python HTTP hop costs about 1.3 ms on the 2-core CI machine (bench/proxy_overhead.py
``--floor``), so with ``--max-tokens 8`` on the tiny model (an 18 ms request) the ratio is about
1.09 however little Werk adds: read the share in milliseconds beside the ratio.

    WERK_VLLM=.../venv/bin/vllm .venv/bin/python bench/vllm_proxy_overhead.py [--runs 40] [--warmup 6]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from werk_vllm import plugin as vllm_plugin  # noqa: E402
from werk_vllm.testing import testmodel  # noqa: E402

from werk_host.config import HostConfig  # noqa: E402
from werk_host.models import ModelManifest, ModelRegistry  # noqa: E402
from werk_host.pluginhost import PluginHost  # noqa: E402
from werk_host.server import build_host  # noqa: E402
from werk_host.testing.hosts import running  # noqa: E402

KEY = "sk-werk-bench-vllm-overhead"
TARGET = 1.05


def vllm_executable() -> Path:
    configured = os.environ.get("WERK_VLLM")
    if configured:
        return Path(configured)
    built = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup-vllm.sh")], check=True, capture_output=True, text=True
    )
    lines = built.stdout.strip().splitlines()
    if not lines:
        sys.exit("vLLM cannot run on this platform (scripts/setup-vllm.sh skipped it)")
    return Path(lines[-1])


class Target:
    """One persistent keep-alive connection; ``post`` returns (ms, parsed JSON)."""

    def __init__(self, port: int, headers: dict[str, str]) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        self.headers = {"Content-Type": "application/json", **headers}

    def post(self, body: bytes) -> tuple[float, dict[str, Any]]:
        start = time.perf_counter()
        self.conn.request("POST", "/v1/chat/completions", body=body, headers=self.headers)
        resp = self.conn.getresponse()
        raw = resp.read()
        elapsed = (time.perf_counter() - start) * 1000.0
        if resp.status != 200:
            raise RuntimeError(f"answered {resp.status}: {raw[:300]!r}")
        data: dict[str, Any] = json.loads(raw)
        return elapsed, data


def p90(values: list[float]) -> float:
    return sorted(values)[max(int(len(values) * 0.9) - 1, 0)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()

    executable = vllm_executable()
    with tempfile.TemporaryDirectory(prefix="werk-bench-vllm-") as tmp:
        root = Path(tmp)
        model_dir = root / "tiny-hf"
        subprocess.run([str(executable.parent / "python"), testmodel.__file__, str(model_dir)], check=True)
        home = root / "home"
        home.mkdir()
        files = sorted(p for p in model_dir.iterdir() if p.is_file())
        ModelRegistry(home).add(ModelManifest.from_paths("bench", files, backend="vllm"))
        plugins = PluginHost()
        plugins.register(vllm_plugin, "vllm")
        options = {"executable": str(executable), "gpu_memory_utilization": 0.1, "max_model_len": 1024}
        config = HostConfig(home=home, api_keys=(KEY,), models=("bench",), backend_options={"vllm": options})
        host = build_host(config, plugins=plugins)
        with running(host) as base:
            adapter = host.fleet.adapter
            live = adapter.live() if adapter is not None else None  # type: ignore[attr-defined]
            assert live is not None, "the vLLM instance is not running"
            pool = live.pool
            werk = Target(int(base.rsplit(":", 1)[1]), {"Authorization": f"Bearer {KEY}"})
            direct = Target(pool.port, dict(pool.auth_headers))
            prompt = "Werk measures its own share of every request. " * 4
            request = {
                "model": "bench",
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": args.max_tokens,
                "temperature": 0,
                "seed": 1,
                "ignore_eos": True,
            }
            body = json.dumps(request).encode()
            for _ in range(args.warmup):
                werk.post(body)
                direct.post(body)
            times: dict[str, list[float]] = {"werk": [], "direct": []}
            usage: set[tuple[int, int]] = set()
            for i in range(args.runs):
                order = (werk, direct) if i % 4 in (0, 3) else (direct, werk)  # ABBA
                for target in order:
                    ms, data = target.post(body)
                    times["werk" if target is werk else "direct"].append(ms)
                    usage.add((data["usage"]["prompt_tokens"], data["usage"]["completion_tokens"]))
            assert len(usage) == 1, f"both paths must do the same work: {usage}"
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"vLLM {executable.parent.parent.name}: {args.runs} rounds, ABBA, usage {usage.pop()} (prompt, completion)")
    for name in ("werk", "direct"):
        print(f"  {name:6s} median {med[name]:8.2f} ms   p90 {p90(times[name]):8.2f} ms")
    print(f"  werk's own share (median difference): {med['werk'] - med['direct']:.2f} ms")
    ratio = med["werk"] / med["direct"]
    print(f"RATIO vllm_proxy_overhead = {ratio:.3f} (target <= {TARGET})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
