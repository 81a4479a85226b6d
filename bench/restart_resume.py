"""Resume a long document after ``werk serve`` restarts: restored named state vs cold prefill.

A real ``werk serve`` subprocess manages llama-server on the real default model
(SmolLM2-135M-Instruct Q4_1, :mod:`werk_host.realmodel`). The run:

1. ``werk serve`` #1: ``POST /prefill`` of a ``--tokens``-token document (mode ``disk``) +
   ``POST /decode`` of 1 token (cold, before the restart); then SIGTERM.
2. ``werk serve`` #2 (a new process, a new llama-server generation, an empty verified-hash
   cache): ``POST /prefill`` of the same document with ``reuse: required`` + ``POST /decode``
   of 1 token. That first token after the restart pays everything a restart costs: the new
   generation's functional probe, one SHA-256 pass over the payload, the restore and the last
   prompt token.
3. the same again (probe done, payload verified): restored, warm.
4. the document with a fresh nonce and ``reuse: disabled``: cold, after the restart.

Prints the figures side by side and ``RATIO restored_after_restart / cold`` (target <= 0.10),
cold being the median of the two cold runs.

    .venv/bin/python bench/restart_resume.py [--tokens 8000] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from werk_llamacpp.binary import find_llama_server  # noqa: E402
from werk_llamacpp.process import LlamaServerProcess  # noqa: E402

from werk_host.models import ModelManifest, ModelRegistry  # noqa: E402
from werk_host.realmodel import smollm2_gguf  # noqa: E402
from werk_host.testing.api import Api  # noqa: E402

KEY = "sk-werk-bench-restart"
MODEL = "doc"
TARGET = 0.10
T = TypeVar("T")


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    start = time.perf_counter()
    result = fn()
    return (time.perf_counter() - start) * 1000.0, result


def document(model: Path, server: Path, n_tokens: int) -> str:
    """English-like text of about ``n_tokens`` tokens, cut with the model's own tokenizer."""
    sentences = [
        f"Section {i}: the committee reviewed shipment {i * 7 % 101} and noted that the "
        f"{('north', 'east', 'south', 'west')[i % 4]} warehouse reported {i * 13 % 97} damaged crates."
        for i in range(n_tokens // 8 + 64)
    ]
    with LlamaServerProcess(model, binary=server, parallel=1, ctx=512, env_args="", slot_save=False) as proc:
        client = proc.new_client()
        ids = client.tokenize(" ".join(sentences), add_special=False)
        return client.detokenize(ids[: n_tokens - 24])


@contextmanager
def werk_serve(home: Path, server: Path, options: list[str]) -> Iterator[tuple[Api, float]]:
    """A ``werk serve`` subprocess; yields its API and the ms until it listened (llama-server up)."""
    env = {**os.environ, "WERK_HOME": str(home), "WERK_API_KEYS": KEY, "WERK_LLAMA_SERVER": str(server)}
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "werk_host", "serve", "--port", "0", "--model", MODEL, *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = json.loads(proc.stdout.readline())["port"]
        yield Api(f"http://127.0.0.1:{port}", KEY, timeout=7200), (time.perf_counter() - start) * 1000.0
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=8000)
    parser.add_argument(
        "--threads", type=int, default=1, help="llama-server -t (default 1: steadier on a shared host; 0: its own)"
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="werk-bench-restart-"))
    home = work / "home"
    home.mkdir(mode=0o700)
    model, server = smollm2_gguf(), find_llama_server()
    ModelRegistry(home).add(ModelManifest.from_paths(MODEL, [model], backend="llama.cpp"))
    text = document(model, server, args.tokens)
    slot_ctx = args.tokens + 256
    options = ["--backend-option", "llamacpp.parallel=2", "--backend-option", f"llamacpp.ctx={2 * slot_ctx}"]
    if args.threads > 0:
        options += ["--backend-option", f"llamacpp.threads={args.threads}"]

    def prefill(api: Api, prompt: str, reuse: str) -> dict[str, Any]:
        body = {
            "model_id": MODEL,
            "input": {"type": "text", "text": prompt},
            "policy": {"mode": "disk", "reuse": reuse},
            "allow_experimental": True,
        }
        status, answer = api.post("/werk/v1/prefill", body)
        assert status == 200, answer
        data: dict[str, Any] = answer["data"]
        return data

    def first_token(api: Api, prompt: str, reuse: str) -> tuple[float, float, dict[str, Any]]:
        t_pre, data = timed(lambda: prefill(api, prompt, reuse))
        body = {"handoff": data["handoff"], "max_tokens": 1, "temperature": 0, "allow_experimental": True}
        t_dec, (status, answer) = timed(lambda: api.post("/werk/v1/decode", body))
        assert status == 200, answer
        return t_pre, t_dec, data

    rows: dict[str, tuple[float, float]] = {}
    with werk_serve(home, server, options) as (api, startup_1):
        warm = f"[{secrets.token_hex(4)}] probe warm-up"
        prefill(api, warm, "disabled")  # the first generation's probe, outside the cold figure
        pre, dec, written = first_token(api, text, "disabled")
        rows["cold_before"] = (pre, dec)
        assert written["reused"] is False
    t_stop = time.perf_counter()
    with werk_serve(home, server, options) as (api, startup_2):
        pre, dec, again = first_token(api, text, "required")
        rows["restored_after_restart"] = (pre, dec)
        assert again["reused"] is True and again["state_id"] == written["state_id"], again
        pre, dec, _ = first_token(api, text, "required")
        rows["restored_warm"] = (pre, dec)
        pre, dec, fresh = first_token(api, f"[{secrets.token_hex(8)}] {text}", "disabled")
        rows["cold_after"] = (pre, dec)
        assert fresh["reused"] is False
    restart_ms = (time.perf_counter() - t_stop) * 1000.0

    print(f"restart_resume | {platform.node()} | {os.cpu_count()} CPUs | llama-server {server}")
    threads = args.threads or "default"
    print(f"model SmolLM2-135M-Instruct Q4_1 | document {written['prompt_tokens']} tokens | threads {threads}")
    print(f"  werk serve start (until listening, llama-server up): #1 {startup_1:.0f} ms, #2 {startup_2:.0f} ms")
    print(f"  (second serve's whole life incl. its 3 measurements: {restart_ms:.0f} ms)")
    for key, label in (
        ("cold_before", "cold prefill + 1st token (serve #1)"),
        ("cold_after", "cold prefill + 1st token (serve #2)"),
        ("restored_after_restart", "restored after restart: 1st token (probe+SHA+restore)"),
        ("restored_warm", "restored again (probe done, payload verified)"),
    ):
        pre, dec = rows[key]
        print(f"  {label:<55} {pre + dec:10.1f} ms  (prefill {pre:9.1f} + decode {dec:9.1f})")
    cold = statistics.median([sum(rows["cold_before"]), sum(rows["cold_after"])])
    ratio = sum(rows["restored_after_restart"]) / cold
    print(f"  cold (median of both) {cold:.1f} ms")
    print(f"RATIO restored_after_restart / cold = {ratio:.4f}  (target <= {TARGET})")
    return 0 if os.environ.get("WERK_BENCH_STRICT") != "1" or ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
