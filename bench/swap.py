"""Two models taking turns in one ``swap`` group: first token after a swap, kept vs recomputed,
and what a swap costs next to a bare ``llama-server`` restart.

A real ``werk serve`` subprocess serves two instances of the real default model
(SmolLM2-135M-Instruct Q4_1, :mod:`werk_host.realmodel`) in ``[group.pair] swap = true``, so at
most one is loaded (docs/deployments.md, "Residency limits"). Each instance holds a ~``--tokens``
conversation; the run alternates one turn on each for ``--rounds`` rounds, so every turn starts
with a swap (the other instance is unloaded through its stop path, this one loaded). Measured:

* **first token after a swap** (streamed ``/v1/chat/completions``, the swap's load included):
  with the prompt cache (the profile's default: context kept across the unload) and with
  ``prompt_cache = 0`` on both instances (recomputed), each in its own ``werk serve``;
* **swap latency**: an operator's ``load`` of the other member (the unload and the load) vs a
  bare ``llama-server`` of the same model stopped and started again (``LlamaServerProcess``).

Prints the figures and ``RATIO`` lines (targets: first token after a swap <= 0.1 x recompute;
swap overhead <= 1.2 x a bare restart)::

    .venv/bin/python bench/swap.py [--rounds 10] [--tokens 6000] [--threads 2]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from werk_llamacpp.binary import find_llama_server  # noqa: E402
from werk_llamacpp.process import LlamaServerProcess  # noqa: E402

from werk_host.models import ModelManifest, ModelRegistry  # noqa: E402
from werk_host.realmodel import smollm2_gguf  # noqa: E402
from werk_host.testing.api import Api  # noqa: E402
from werk_host.testing.hosts import serve_process  # noqa: E402

KEY = "sk-werk-bench-swap-operator"
CTX = 16384  # two slots of 8192: a ~6k conversation and its answers fit
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "the",
    "lazy",
    "dog",
    "while",
    "the",
    "river",
    "keeps",
    "running",
    "to",
    "the",
    "sea",
]


def _profile(prompt_cache: bool, threads: int) -> str:
    cache = "" if prompt_cache else "prompt_cache = 0\n"
    options = f"options = {{ ctx = {CTX}, threads = {threads} }}\n"
    return "".join(f'[[instance]]\nid = "{i}"\nmodel = "smol"\n{options}{cache}' for i in ("a", "b")) + (
        '[group.pair]\nmembers = ["a", "b"]\nswap = true\n[residency]\nload_timeout = "10m"\n'
    )


def _document(tokens: int, seed: int) -> str:
    words = [WORDS[(i * 7 + seed) % len(WORDS)] for i in range(int(tokens * 0.9))]
    return f"Conversation {seed}. Remember this text.\n" + " ".join(words)


def _first_token_ms(url: str, model: str, messages: list[dict[str, str]]) -> tuple[float, str]:
    """Stream one turn: milliseconds to the first content chunk, and the whole answer."""
    body = {"model": model, "messages": messages, "max_tokens": 16, "temperature": 0, "stream": True}
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=600)
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    start = time.perf_counter()
    first: float | None = None
    text = ""
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=headers)
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"{model}: HTTP {resp.status}: {resp.read()[:500]!r}")
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            if delta and first is None:
                first = (time.perf_counter() - start) * 1000.0
            text += delta
    finally:
        conn.close()
    return (first if first is not None else (time.perf_counter() - start) * 1000.0), text


def _run(home: Path, rounds: int, tokens: int, threads: int, *, prompt_cache: bool) -> dict[str, list[float]]:
    profile = home.parent / ("kept.toml" if prompt_cache else "recomputed.toml")
    profile.write_text(_profile(prompt_cache, threads))
    firsts: list[float] = []
    swaps: list[float] = []
    with serve_process(home, "--profile", str(profile), keys=(), env={"WERK_OPERATOR_API_KEYS": KEY}) as served:
        operator = Api(served.url, KEY, timeout=600)
        chats = {m: [{"role": "user", "content": _document(tokens, seed)}] for seed, m in enumerate(("a", "b"))}
        for model in ("a", "b"):  # the first turn of each: a cold prefill, not measured
            _, answer = _first_token_ms(served.url, model, chats[model])
            chats[model] += [{"role": "assistant", "content": answer}]
        for turn in range(rounds):
            for model in ("a", "b"):
                chats[model].append({"role": "user", "content": f"Turn {turn}: what did the text say?"})
                ms, answer = _first_token_ms(served.url, model, chats[model])
                chats[model].append({"role": "assistant", "content": answer})
                firsts.append(ms)
                print(f"  {'kept' if prompt_cache else 'recomputed'} turn {turn} {model}: first token {ms:.0f} ms")
        if prompt_cache:  # the swap itself: an operator's load of the other member, round trips
            for _ in range(rounds):
                for model in ("a", "b"):  # b was loaded last: each load is a swap
                    start = time.perf_counter()
                    status, doc = operator.post(f"/werk/v1/deployments/{model}/actions", {"action": "load"})
                    assert status == 200, doc
                    swaps.append((time.perf_counter() - start) * 1000.0)
    return {"first": firsts, "swap": swaps}


def _bare_restart_ms(model: Path, rounds: int, threads: int) -> list[float]:
    """Stop a running llama-server and start a new one on the same model (healthy again)."""
    binary = find_llama_server(use_path=False)
    proc = LlamaServerProcess(model, binary=binary, parallel=2, ctx=CTX, threads=threads, env_args="")
    proc.start()
    times: list[float] = []
    try:
        for _ in range(rounds * 2):
            start = time.perf_counter()
            proc.stop()
            proc = LlamaServerProcess(model, binary=binary, parallel=2, ctx=CTX, threads=threads, env_args="")
            proc.start()
            times.append((time.perf_counter() - start) * 1000.0)
    finally:
        proc.stop()
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=10, help="alternating rounds (default 10)")
    parser.add_argument("--tokens", type=int, default=6000, help="conversation size in tokens (default 6000)")
    parser.add_argument("--threads", type=int, default=2, help="llama-server threads (default 2)")
    args = parser.parse_args(argv)
    model = smollm2_gguf()
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="werk-bench-swap-") as tmp:
        for prompt_cache in (True, False):
            home = Path(tmp) / ("kept" if prompt_cache else "recomputed") / "home"
            home.mkdir(parents=True)
            ModelRegistry(home).add(ModelManifest.from_paths("smol", [model], backend="llama.cpp"))
            results["kept" if prompt_cache else "recomputed"] = _run(
                home, args.rounds, args.tokens, args.threads, prompt_cache=prompt_cache
            )
    bare = _bare_restart_ms(model, args.rounds, args.threads)
    kept = statistics.median(results["kept"]["first"])
    recomputed = statistics.median(results["recomputed"]["first"])
    swap = statistics.median(results["kept"]["swap"])
    restart = statistics.median(bare)
    print(f"first token after a swap, context kept:  median {kept:.0f} ms over {len(results['kept']['first'])} turns")
    print(f"first token after a swap, recomputed:    median {recomputed:.0f} ms")
    print(f"swap (operator load of the other member): median {swap:.0f} ms")
    print(f"bare llama-server restart (stop + start): median {restart:.0f} ms")
    print(f"RATIO first_token_after_swap_kept / recomputed = {kept / recomputed:.3f} (target <= 0.1)")
    print(f"RATIO swap / bare_restart = {swap / restart:.3f} (target <= 1.2)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
