"""The same GGUF on the candle bridge (mistral.rs in process) and on llama.cpp (llama-server), side by side.

Two Werk hosts run in this process, each on waitress like ``werk serve``: one with the
``werk-candle-bridge`` plugin, one with ``werk-llamacpp`` (one slot), both serving the same file —
by default the real SmolLM2-135M-Instruct Q4_1 (:func:`werk_host.realmodel.smollm2_gguf`), or
``--model generated`` (the tiny random model of ``werk_llamacpp.testing.testmodel``). Each round sends
the same streamed chat request to both, alternating which goes first (ABBA), after a warm-up:
about ``--prompt-tokens`` prompt tokens behind a fresh nonce (so neither engine can reuse a
cached prefix), ``--max-tokens`` output tokens with ``ignore_eos``, temperature 0.

Measured from the client, per request:

* first-token latency: from sending the request to the first SSE event with text;
* prompt throughput: prompt tokens / first-token latency;
* decode throughput: (completion tokens - 1) / (last event - first text event).

Prints the medians side by side, then ``RATIO candle/llama.cpp first-token latency`` and, last,
``RATIO candle/llama.cpp decode tokens/s`` (target >= 0.5: half of llama.cpp's decode speed).

    .venv/bin/python bench/candle_vs_llamacpp.py [--runs 5] [--warmup 1] [--prompt-tokens 48]
        [--max-tokens 32] [--model smollm2|generated]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from werk_candle_bridge import plugin as candle_plugin  # noqa: E402
from werk_candle_bridge.engine import missing_engine_reason  # noqa: E402
from werk_llamacpp import plugin as llama_plugin  # noqa: E402
from werk_llamacpp.binary import LlamaServerNotFound, find_llama_server  # noqa: E402
from werk_llamacpp.testing.testmodel import generate_model  # noqa: E402

from werk_host.models import ModelManifest  # noqa: E402
from werk_host.realmodel import smollm2_gguf  # noqa: E402
from werk_host.testing.hosts import make_host, running  # noqa: E402

KEY = "sk-werk-bench-candle"
MODEL = "bench"
TARGET = 0.5
FILLER = "the quick brown fox jumps over the lazy dog while the cache keeps every token it saw"


def llama_server() -> Path:
    """The cached/configured llama-server, building it once with the project script if needed."""
    try:
        return find_llama_server()
    except LlamaServerNotFound:
        print("llama-server not found: building it with scripts/build-llama-server.sh", file=sys.stderr)
        built = subprocess.run(
            ["bash", str(ROOT / "scripts" / "build-llama-server.sh")], check=True, capture_output=True, text=True
        )
        return Path(built.stdout.strip().splitlines()[-1])


@dataclass
class Samples:
    ttft_ms: list[float] = field(default_factory=list)
    prompt_tps: list[float] = field(default_factory=list)
    decode_tps: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Target:
    """A Werk host's ``/v1/chat/completions``, called over a fresh connection per streamed request."""

    def __init__(self, base: str) -> None:
        self.port = int(base.rsplit(":", 1)[1])

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        try:
            headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
            conn.request("POST", path, body=json.dumps(body).encode(), headers=headers)
            resp = conn.getresponse()
            data: dict[str, Any] = json.loads(resp.read())
            if resp.status != 200:
                raise RuntimeError(f"{path} answered {resp.status}: {data}")
            return data
        finally:
            conn.close()

    def stream(self, body: dict[str, Any], into: Samples | None) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
        try:
            start = time.perf_counter()
            conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(), headers=headers)
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"answered {resp.status}: {resp.read()[:300]!r}")
            first = last = 0.0
            usage: dict[str, Any] | None = None
            for line in resp:
                if not line.startswith(b"data: {"):
                    continue
                event = json.loads(line[6:])
                usage = event.get("usage") or usage
                choices = event.get("choices") or []
                if choices and (choices[0].get("delta") or {}).get("content"):
                    last = time.perf_counter()
                    first = first or last
        finally:
            conn.close()
        if usage is None or not first:
            raise RuntimeError("the stream carried no text or no usage")
        if into is None:
            return
        into.prompt_tokens, into.completion_tokens = usage["prompt_tokens"], usage["completion_tokens"]
        ttft = first - start
        into.ttft_ms.append(ttft * 1000.0)
        into.prompt_tps.append(usage["prompt_tokens"] / ttft)
        if usage["completion_tokens"] > 1 and last > first:
            into.decode_tps.append((usage["completion_tokens"] - 1) / (last - first))


def calibrate(target: Target, tokens: int) -> str:
    """A user message whose chat prompt is about ``tokens`` tokens (counted by the candle host)."""
    words = FILLER.split()
    text = ""
    for i in range(4 * tokens):
        candidate = f"{text} {words[i % len(words)]}".strip()
        body = {"model": MODEL, "messages": [{"role": "user", "content": candidate}]}
        if target.post("/werk/v1/chat/count_tokens", body)["data"]["input_tokens"] > tokens:
            break
        text = candidate
    return text


@contextmanager
def hosts(model: Path, server: Path, work: Path) -> Iterator[tuple[Target, Target]]:
    with ExitStack() as stack:
        candle = make_host(
            work / "candle-home",
            api_keys=(KEY,),
            plugin=candle_plugin,
            plugin_name="candle",
            model=ModelManifest.from_paths(MODEL, [model], backend="candle"),
        )
        llama = make_host(
            work / "llama-home",
            api_keys=(KEY,),
            plugin=llama_plugin,
            plugin_name="llamacpp",
            model=ModelManifest.from_paths(MODEL, [model], backend="llama.cpp"),
            backend_options={"llama_server": str(server), "parallel": 1},
        )
        candle_url = stack.enter_context(running(candle))
        llama_url = stack.enter_context(running(llama))
        yield Target(candle_url), Target(llama_url)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--prompt-tokens", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--model", choices=("smollm2", "generated"), default="smollm2")
    args = parser.parse_args(argv)
    missing = missing_engine_reason()
    if missing is not None:
        print(f"cannot run: {missing}", file=sys.stderr)
        return 2
    server = llama_server()
    with tempfile.TemporaryDirectory(prefix="werk-bench-candle-") as tmp:
        work = Path(tmp)
        model = smollm2_gguf() if args.model == "smollm2" else generate_model(work / "generated.gguf")
        with hosts(model, server, work) as (candle, llama):
            content = calibrate(candle, args.prompt_tokens)
            targets = {"candle": candle, "llama.cpp": llama}
            samples = {name: Samples() for name in targets}
            for round_no in range(args.warmup + args.runs):
                order = list(targets) if round_no % 2 == 0 else list(targets)[::-1]
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"{secrets.token_hex(3)} {content}"}],
                    "max_tokens": args.max_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                for name in order:
                    targets[name].stream(body, samples[name] if round_no >= args.warmup else None)
    print(
        f"model {model.name} | prompt ~{samples['candle'].prompt_tokens} tokens (fresh nonce each round) | "
        f"max_tokens {args.max_tokens} (ignore_eos) | streamed chat through Werk /v1 | runs {args.runs} per engine "
        f"after {args.warmup} warm-up (ABBA) | {platform.machine()} {os.cpu_count()} CPUs | "
        f"load {os.getloadavg()[0]:.2f} | llama-server {server.parent.name}"
    )
    print(f"  {'engine':<10} {'first token ms':>15} {'prompt tok/s':>13} {'decode tok/s':>13}")
    med: dict[str, tuple[float, float, float]] = {}
    for name, s in samples.items():
        med[name] = (statistics.median(s.ttft_ms), statistics.median(s.prompt_tps), statistics.median(s.decode_tps))
        ttft, ptps, dtps = med[name]
        print(f"  {name:<10} {ttft:>15.1f} {ptps:>13.1f} {dtps:>13.1f}")
    latency = med["candle"][0] / med["llama.cpp"][0]
    print(f"RATIO candle/llama.cpp first-token latency = {latency:.2f}  (lower is better; llama.cpp = 1)")
    ratio = med["candle"][2] / med["llama.cpp"][2]
    print(f"RATIO candle/llama.cpp decode tokens/s = {ratio:.3f}  (target >= {TARGET})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
