"""Time to first token from a restored named state vs cold prefill vs llama-server's own restore.

One Werk host (in process, on waitress) manages one llama-server (2 slots) on the real default
model, SmolLM2-135M-Instruct Q4_1 (``--model smollm2``, :mod:`werk_host.realmodel`), or on a
generated 256-dim model (``--model generated``). For each prompt size (``--tokens``, default
2,000 and 8,000 tokens; a fresh nonce at the front so no cache can serve a cold run):

* raw cold       - llama-server alone: ``/completion`` of the prompt, 1 token, on an empty slot;
* werk cold      - Werk ``POST /prefill`` (new state, snapshot committed to disk) + ``POST /decode``;
* werk restored  - after the state slot was taken by other work: ``POST /prefill`` (reused, no
                   compute) + ``POST /decode`` 1 token, which restores the verified snapshot into
                   the slot and evaluates only the last prompt token. The first use of a state
                   is shown apart: it may include the payload's one SHA-256 pass (the store
                   remembers a verified file; it never hashes the same bytes twice);
* raw restore    - llama-server alone: ``/slots?action=restore`` of its saved file + 1 token.

Cold runs are measured ``--cold`` times (they take seconds to minutes on a CPU), restores
``--rounds`` times after one warm-up. Prints medians side by side, Werk's split between
``/prefill`` and ``/decode``, the restore evidence and, per size, restored/cold (target <= 0.10)
and Werk restored / raw restore (target <= 1.5, issue 20 item 2); the last line is the worst
Werk/raw ratio over the sizes.

    .venv/bin/python bench/ttft_reuse.py --model smollm2 [--tokens 2000,8000] [--rounds 9] [--cold 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from werk_llamacpp.adapter import LlamaCppAdapter  # noqa: E402
from werk_llamacpp.binary import find_llama_server  # noqa: E402
from werk_llamacpp.native import LlamaServerClient  # noqa: E402
from werk_llamacpp.testing.testmodel import generate_model  # noqa: E402

from werk_host.config import HostConfig  # noqa: E402
from werk_host.models import ModelManifest, ModelRegistry  # noqa: E402
from werk_host.realmodel import smollm2_gguf  # noqa: E402
from werk_host.server import build_host  # noqa: E402
from werk_host.testing.api import Api  # noqa: E402
from werk_host.testing.hosts import running  # noqa: E402

KEY = "sk-werk-bench-ttft"
MODEL = "bench"
RESTORED_VS_COLD = 0.10
WERK_VS_RAW = 1.5
T = TypeVar("T")


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    start = time.perf_counter()
    result = fn()
    return (time.perf_counter() - start) * 1000.0, result


def document(client: LlamaServerClient, n_tokens: int) -> str:
    """English-like text of about ``n_tokens`` tokens (room left for a nonce)."""
    sentences = [
        f"Section {i}: the committee reviewed shipment {i * 7 % 101} and noted that the "
        f"{('north', 'east', 'south', 'west')[i % 4]} warehouse reported {i * 13 % 97} damaged crates."
        for i in range(n_tokens // 8 + 64)
    ]
    ids = client.tokenize(" ".join(sentences), add_special=False)
    return client.detokenize(ids[: n_tokens - 24])


def model_path(kind: str, work: Path) -> tuple[Path, str]:
    if kind == "smollm2":
        return smollm2_gguf(), "SmolLM2-135M-Instruct Q4_1 (30 layers)"
    return generate_model(work / "bench.gguf", dim=256, layers=4, heads=8, ctx=16384), "generated 256-dim 4-layer"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("smollm2", "generated"), default="smollm2")
    parser.add_argument("--tokens", default="2000,8000", help="comma-separated prompt sizes")
    parser.add_argument("--rounds", type=int, default=15, help="restores measured per size")
    parser.add_argument("--cold", type=int, default=1, help="cold prefills measured per size and side")
    parser.add_argument(
        "--threads", type=int, default=1, help="llama-server -t (default 1: steadier on a shared host; 0: its own)"
    )
    args = parser.parse_args()
    sizes = [int(t) for t in args.tokens.split(",")]
    slot_ctx = max(sizes) + 256

    work = Path(tempfile.mkdtemp(prefix="werk-bench-ttft-"))
    model, described = model_path(args.model, work)
    home = work / "home"
    home.mkdir()
    ModelRegistry(home).add(ModelManifest.from_paths(MODEL, [model], backend="llama.cpp"))
    server = find_llama_server()
    options: dict[str, Any] = {"llama_server": str(server), "parallel": 2, "ctx": 2 * slot_ctx}
    if args.threads > 0:
        options["threads"] = args.threads
    host = build_host(HostConfig(home=home, api_keys=(KEY,), model=MODEL, backend_options={"llamacpp": options}))
    adapter = host.fleet.adapter
    assert isinstance(adapter, LlamaCppAdapter)
    proc = adapter.current()
    assert proc is not None and proc.slot_dir is not None
    raw = proc.new_client(timeout=3600, n_slots=2)
    raw_slot = 0  # Werk's state slot is the last one

    results: dict[int, dict[str, list[float]]] = {}
    evidence: dict[int, dict[str, object]] = {}
    with running(host) as base:
        api = Api(base, KEY, timeout=7200)

        def prefill(prompt: str) -> dict[str, Any]:
            body = {"model_id": MODEL, "input": {"type": "text", "text": prompt}, "allow_experimental": True}
            status, answer = api.post("/werk/v1/prefill", body)
            assert status == 200, answer
            data: dict[str, Any] = answer["data"]
            return data

        def decode(handoff: str) -> dict[str, Any]:
            body = {"handoff": handoff, "max_tokens": 1, "temperature": 0, "allow_experimental": True}
            status, answer = api.post("/werk/v1/decode", body)
            assert status == 200, answer
            data: dict[str, Any] = answer["data"]
            return data

        prefill("warm up " + secrets.token_hex(4))  # the functional probe runs outside the measurement
        for size in sizes:
            text = document(raw, size)
            rows: dict[str, list[float]] = {
                k: []
                for k in ("raw_cold", "werk_cold", "first", "restored", "restored_prefill", "restored_decode", "raw")
            }
            name = f"bench-{secrets.token_hex(6)}.bin"
            for _ in range(args.cold):
                ids = raw.tokenize(f"[{secrets.token_hex(8)}] {text}", add_special=True)
                raw.slot_erase(raw_slot)
                t_raw, done = timed(lambda: raw.completion(ids, id_slot=raw_slot, n_predict=1, cache_prompt=True))
                assert done.prompt_n == len(ids), done
                rows["raw_cold"].append(t_raw)
            raw.slot_save(raw_slot, name)  # the last cold prompt, for the raw restores
            prompt = ""
            for _ in range(args.cold):
                prompt = f"[{secrets.token_hex(8)}] {text}"
                t_pre, data = timed(lambda: prefill(prompt))
                t_dec, _ = timed(lambda: decode(str(data["handoff"])))
                assert data["reused"] is False
                rows["werk_cold"].append(t_pre + t_dec)
            for round_no in range(args.rounds + 1):
                adapter.forget_slot()  # the state slot was used by other work meanwhile
                t_pre, again = timed(lambda: prefill(prompt))
                t_dec, _ = timed(lambda: decode(str(again["handoff"])))
                assert again["reused"] is True and adapter.last_decode["source"] == "stored"
                raw.slot_erase(raw_slot)

                def raw_restore() -> object:
                    raw.slot_restore(raw_slot, name)
                    return raw.completion(ids, id_slot=raw_slot, n_predict=1, cache_prompt=True)

                t_rr, _ = timed(raw_restore)
                if round_no == 0:
                    rows["first"].append(t_pre + t_dec)
                    continue
                rows["restored"].append(t_pre + t_dec)
                rows["restored_prefill"].append(t_pre)
                rows["restored_decode"].append(t_dec)
                rows["raw"].append(t_rr)
            (proc.slot_dir / name).unlink(missing_ok=True)
            results[size] = rows
            evidence[size] = dict(adapter.last_decode)
    host.close()

    print(f"ttft_reuse | {platform.node()} | {os.cpu_count()} CPUs | llama-server {server}")
    threads = args.threads or "default"
    print(f"model {described} | slots 2 x {slot_ctx} | threads {threads}", end=" | ")
    print(f"restores {args.rounds} (+1 first) | cold runs {args.cold}")
    worst = 0.0
    for size, rows in results.items():
        med = {k: statistics.median(v) for k, v in rows.items() if v}
        print(f"\n{evidence[size]['prompt_tokens']} prompt tokens:")
        for key, label in (
            ("raw_cold", "raw llama-server cold prefill + 1st token"),
            ("werk_cold", "Werk prefill (disk commit) + decode 1st token"),
            ("first", "Werk restored, first use (+ SHA-256 when unverified)"),
            ("restored", "Werk restored: reused prefill + decode 1st token"),
            ("restored_prefill", "  of which POST /prefill (reuse decision)"),
            ("restored_decode", "  of which POST /decode (restore + 1st token)"),
            ("raw", "raw llama-server slot restore + 1st token"),
        ):
            runs = [round(x, 1) for x in rows[key]]
            print(f"  {label:<55} median {med[key]:10.2f} ms   runs {runs}")
        vs_cold = med["restored"] / med["raw_cold"]
        vs_raw = med["restored"] / med["raw"]
        first_vs_raw = med["first"] / med["raw"]
        worst = max(worst, vs_raw)
        print(f"  restore evidence (last round): {evidence[size]}")
        print(f"  ratio werk_restored / raw_cold       = {vs_cold:.4f}  (target <= {RESTORED_VS_COLD})")
        print(f"  ratio werk_restored / raw_restore    = {vs_raw:.3f}  (target <= {WERK_VS_RAW})")
        print(f"  ratio werk_first_use / raw_restore   = {first_vs_raw:.3f}  (first use of a state, for reference)")
    print(f"RATIO werk_restored / raw_restore (worst size) = {worst:.3f}  (target <= {WERK_VS_RAW})")
    return 0 if os.environ.get("WERK_BENCH_STRICT") != "1" or worst <= WERK_VS_RAW else 1


if __name__ == "__main__":
    sys.exit(main())
