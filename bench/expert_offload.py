"""MoE expert offload against stock mlx-lm: peak memory and decode speed, side by side.

A generated mid-size random-weight ``qwen3_moe`` (``werk_omlx.testing.testmodel.MID``: 8 layers × 16
experts of 3 MiB in float32, top-2, 384 MiB of experts; cached under
``~/.cache/werk/omlx-bench/``) is run greedily on the same chat prompt by

* ``stock``         - ``mlx_lm.load`` + ``stream_generate`` (every expert resident);
* ``offload <MiB>`` - the Werk worker's loader (``werk_omlx.worker.engine.load``) with the expert
                      cache at two budgets, the same ``stream_generate``,

each in its own fresh process (so peaks do not mix). Per configuration it prints MLX's peak
allocation (``mx.get_peak_memory``), the process's peak RSS (``VmHWM``), prompt and decode tokens/s and,
for offload, the cache's hits, misses and evictions; it checks that every configuration produced
the same text, then ends with one ``RATIO`` line per budget for memory (offload/stock peak MLX
memory) and for speed (offload/stock decode tokens/s).

    .venv/bin/python bench/expert_offload.py [--budgets 48 192] [--tokens 48]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from werk_host.paths import user_cache_dir  # noqa: E402

MIB = 1024 * 1024
PROMPT = (
    "Explain, step by step, how a mixture-of-experts model decides which experts to run for each token, "
    "why a bounded cache of expert tensors can keep memory low, and what it costs when the cache misses."
)
#: Peak MLX memory targets (offload/stock) for the smaller and the larger budget: the small one
#: must at least halve it; the large one (half the experts) must still save a quarter.
MEMORY_TARGETS = (0.5, 0.75)
#: Decode speed target (offload/stock): stacking the routed experts and reading misses from disk
#: may cost up to half the tokens/s on CPU.
SPEED_TARGET = 0.5


def bench_model() -> Path:
    """The MID model, generated once into the user cache (idempotent)."""
    from werk_omlx.testing.testmodel import MID, generate

    out = user_cache_dir() / "omlx-bench" / f"qwen3-moe-mid-{MID.layers}x{MID.experts}-seed0"
    if not (out / "model.safetensors").is_file():
        print(f"[bench] generating the mid-size MoE into {out} (once)", file=sys.stderr)
        if out.exists():
            import shutil

            shutil.rmtree(out)
        generate(out, MID, seed=0)
    return out


def peak_rss_mib() -> float:
    """This process's peak resident set: ``VmHWM`` on Linux (``ru_maxrss`` would include the
    parent's peak, which survives fork and exec), ``ru_maxrss`` (bytes) on macOS."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / MIB


def measure(model_dir: Path, budget_mib: int | None, tokens: int) -> dict[str, Any]:
    """One configuration, in this process (run by :func:`run_one` in a fresh interpreter)."""
    import mlx.core as mx
    from mlx_lm.generate import stream_generate
    from werk_omlx.worker.engine import load

    if budget_mib is None:
        from mlx_lm import load as stock_load

        model, tokenizer = stock_load(str(model_dir))
        store = None
    else:
        loaded = load(model_dir, budget_mib * MIB)
        model, tokenizer, store = loaded.model, loaded.tokenizer, loaded.store
        assert store is not None, loaded.offload_reason
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True)
    text, last = "", None
    for response in stream_generate(model, tokenizer, prompt, max_tokens=tokens):
        text += response.text
        last = response
    assert last is not None
    result: dict[str, Any] = {
        "peak_mlx_mib": mx.get_peak_memory() / MIB,
        "max_rss_mib": peak_rss_mib(),
        "prompt_tokens": last.prompt_tokens,
        "generated": last.generation_tokens,
        "prompt_tps": last.prompt_tps,
        "decode_tps": last.generation_tps,
        "text": text,
    }
    if store is not None:
        result.update(store.snapshot())
    return result


def run_one(model_dir: Path, budget_mib: int | None, tokens: int) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--one", str(model_dir), "--tokens", str(tokens)]
    if budget_mib is not None:
        argv += ["--budget", str(budget_mib)]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", type=int, nargs=2, default=[48, 192], metavar="MIB")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--budget", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one, args.budget, args.tokens)))
        return 0

    from werk_omlx.testing.testmodel import MID

    model_dir = bench_model()
    configs: list[tuple[str, int | None]] = [("stock", None), *((f"offload {b} MiB", b) for b in args.budgets)]
    results = {name: run_one(model_dir, budget, args.tokens) for name, budget in configs}
    stock = results["stock"]
    experts_mib = MID.layers * MID.experts * MID.expert_bytes() / MIB
    print(
        f"qwen3_moe {MID.layers} layers x {MID.experts} experts of {MID.expert_bytes() / MIB:.1f} MiB "
        f"({experts_mib:.0f} MiB of experts), top-{MID.top_k}; prompt {stock['prompt_tokens']} tokens, "
        f"{stock['generated']} generated, greedy, CPU"
    )
    print(f"{'config':18s} {'peak MLX MiB':>13s} {'peak RSS MiB':>12s} {'prompt tok/s':>13s} {'decode tok/s':>13s}"
          f" {'hits':>7s} {'misses':>7s} {'evictions':>9s}")  # fmt: skip
    for name, r in results.items():
        counters = (r.get("hits", "-"), r.get("misses", "-"), r.get("evictions", "-"))
        print(
            f"{name:18s} {r['peak_mlx_mib']:13.1f} {r['max_rss_mib']:12.1f} {r['prompt_tps']:13.1f} "
            f"{r['decode_tps']:13.2f} {counters[0]!s:>7s} {counters[1]!s:>7s} {counters[2]!s:>9s}"
        )
    same = all(r["text"] == stock["text"] for r in results.values())
    print(f"identical output in every configuration: {'yes' if same else 'NO'}")
    for (name, budget), target in zip(configs[1:], MEMORY_TARGETS, strict=True):
        r = results[name]
        print(f"RATIO expert_offload_memory_{budget}mib = {r['peak_mlx_mib'] / stock['peak_mlx_mib']:.3f}"
              f" (target <= {target})")  # fmt: skip
        print(f"RATIO expert_offload_speed_{budget}mib = {r['decode_tps'] / stock['decode_tps']:.3f}"
              f" (target >= {SPEED_TARGET})")  # fmt: skip
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
