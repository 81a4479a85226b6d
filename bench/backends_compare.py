"""The same tiny checkpoint on transformers, ONNX Runtime GenAI, vLLM and llama.cpp, side by side.

One tiny random-weight Llama (``werk_transformers.testing``: 2 layers, hidden size 128, the same
file bytes every run) is served by each backend through a real ``werk serve`` process
(``werk_host.testing.hosts.serve_process``), one backend at a time:

* ``transformers``: the checkpoint directory, ``WERK_TRANSFORMERS_PYTHON`` (docs/transformers.md);
* ``onnx-genai``: the checkpoint converted by ``onnxruntime_genai.models.builder`` (FP32, CPU),
  ``WERK_ONNX_GENAI_PYTHON`` (docs/onnx-genai.md);
* ``vllm``: the checkpoint directory, ``WERK_VLLM`` (docs/vllm.md);
* ``llama.cpp``: the checkpoint converted to GGUF by llama.cpp's ``convert_hf_to_gguf.py``
  when ``WERK_GGUF_CONVERTER`` names one (run with the transformers interpreter, which needs the
  ``gguf`` package) and ``WERK_LLAMA_SERVER`` is set; otherwise skipped with the reason.

A backend whose engine is missing is skipped with the reason. Each round sends the same streamed
chat request (temperature 0, ``--max-tokens`` output tokens) after a warm-up, and measures from
the client: first-token latency (request sent to the first SSE event with text) and decode
throughput ((completion tokens - 1) / (the usage event - first text event); a random model's
byte tokens are held back until they form whole characters, so the last text event is no clock). Prints the medians
side by side, then ``RATIO`` lines against transformers, the reference every other backend here
should beat on decode:

    .venv/bin/python bench/backends_compare.py [--runs 5] [--warmup 1] [--max-tokens 48]
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
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from werk_onnx_genai.testing import tiny_genai_model  # noqa: E402
from werk_transformers.testing import tiny_checkpoint  # noqa: E402

from werk_host.testing.hosts import serve_process  # noqa: E402

KEY = "sk-werk-bench-backends-" + "b" * 16
MESSAGES = [{"role": "user", "content": "Write a short story about a quiet library and the rivers near it."}]


@dataclass
class Result:
    first_ms: list[float] = field(default_factory=list)
    decode_tps: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)


def _stream(port: int, max_tokens: int) -> tuple[float, float, int]:
    body = {
        "model": "bench",
        "messages": MESSAGES,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    sent = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
    answer = conn.getresponse()
    assert answer.status == 200, answer.read()[:500]
    first = last = 0.0
    completion = 0
    for raw in answer:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        doc = json.loads(line[6:])
        if doc.get("usage"):
            completion = int(doc["usage"]["completion_tokens"])
            last = time.perf_counter()  # the answer's end: held-back bytes of a piece count too
        if not first and any(c.get("delta", {}).get("content") for c in doc.get("choices", [])):
            first = time.perf_counter()
    conn.close()
    return (
        (first - sent) * 1000,
        (completion - 1) / (last - first) if completion > 1 and last > first else 0.0,
        completion,
    )


def _werk(home: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "werk_host", *args], check=True, env={**os.environ, "WERK_HOME": str(home)})


def measure(
    name: str, model: Path, backend: str, env: dict[str, str], extra: list[str], args: argparse.Namespace
) -> Result:
    with tempfile.TemporaryDirectory(prefix="werk-bench-") as tmp:
        home = Path(tmp) / "home"
        _werk(home, "models", "add", "bench", str(model), "--backend", backend)
        started = time.perf_counter()
        with serve_process(home, "--model", "bench", *extra, keys=(KEY,), env=env) as live:
            port = int(live.url.rsplit(":", 1)[1])
            for _ in range(args.warmup):
                _stream(port, args.max_tokens)
            print(f"[bench] {name}: ready and warm in {time.perf_counter() - started:.1f} s", file=sys.stderr)
            result = Result()
            for _ in range(args.runs):
                first, tps, tokens = _stream(port, args.max_tokens)
                result.first_ms.append(first)
                result.decode_tps.append(tps)
                result.tokens.append(tokens)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    tf_python = os.environ.get("WERK_TRANSFORMERS_PYTHON")
    og_python = os.environ.get("WERK_ONNX_GENAI_PYTHON")
    if not tf_python:
        print("WERK_TRANSFORMERS_PYTHON is not set (bash scripts/setup-engine-venv.sh transformers)", file=sys.stderr)
        return 2
    checkpoint = tiny_checkpoint(tf_python)
    plans: list[tuple[str, Path, str, dict[str, str], list[str]]] = []
    skipped: list[str] = []
    plans.append(("transformers", checkpoint, "transformers", {"WERK_TRANSFORMERS_PYTHON": tf_python}, []))
    if og_python:
        plans.append(
            ("onnx-genai", tiny_genai_model(og_python), "onnx-genai", {"WERK_ONNX_GENAI_PYTHON": og_python}, [])
        )
    else:
        skipped.append("onnx-genai: WERK_ONNX_GENAI_PYTHON is not set")
    if os.environ.get("WERK_VLLM"):
        # A CPU build refuses to start with vLLM's default memory fraction (docs/vllm.md).
        plans.append(("vllm", checkpoint, "vllm", {}, ["--backend-option", "vllm.gpu_memory_utilization=0.1"]))
    else:
        skipped.append("vllm: WERK_VLLM is not set (bash scripts/setup-vllm.sh)")
    converter = os.environ.get("WERK_GGUF_CONVERTER")
    if converter and os.environ.get("WERK_LLAMA_SERVER"):
        gguf = Path(tempfile.mkdtemp(prefix="werk-bench-gguf-")) / "tiny.gguf"
        subprocess.run([tf_python, converter, str(checkpoint), "--outfile", str(gguf), "--outtype", "f32"], check=True)
        plans.append(("llama.cpp", gguf, "llamacpp", {}, []))
    else:
        skipped.append(
            "llama.cpp: no GGUF conversion (set WERK_GGUF_CONVERTER to convert_hf_to_gguf.py and WERK_LLAMA_SERVER)"
        )
    results = {name: measure(name, model, backend, env, extra, args) for name, model, backend, env, extra in plans}
    print(f"{'backend':<14} {'first token ms':>15} {'decode tok/s':>13} {'tokens':>7}   (medians of {args.runs})")
    for name, r in results.items():
        first, tps = statistics.median(r.first_ms), statistics.median(r.decode_tps)
        print(f"{name:<14} {first:>15.1f} {tps:>13.1f} {statistics.median(r.tokens):>7.0f}")
    for line in skipped:
        print(f"skipped {line}")
    base = results["transformers"]
    for name, r in results.items():
        if name == "transformers":
            continue
        first = statistics.median(r.first_ms) / statistics.median(base.first_ms)
        decode = statistics.median(r.decode_tps) / statistics.median(base.decode_tps)
        print(f"RATIO {name}/transformers first-token latency = {first:.2f}  (target <= 1: lower is better)")
        print(f"RATIO {name}/transformers decode tokens/s = {decode:.2f}  (target >= 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
