"""Time to first token: cold prefill vs a disk-restored named state, side by side in one run.

One llama-server (a generated 256-dim, 4-layer model), a ~2,000-token prompt with a fresh
nonce per round so no cache can serve it. Each round measures, interleaved:

* raw cold      – llama-server alone: ``/completion`` of the prompt, 1 token, on an empty slot;
* werk cold     – Werk ``POST /prefill`` (new state, snapshot committed to disk) + ``POST /decode`` 1 token;
* werk restored – after the state slot was taken by other work: ``POST /prefill`` again (reused,
                  no compute) + ``POST /decode`` 1 token, which verifies the snapshot's SHA-256,
                  restores it into the slot and evaluates only the last prompt token;
* raw restore   – llama-server alone: ``/slots?action=restore`` of a saved file + 1 token.

Prints medians and the ratio werk-restored / raw-cold (target <= 0.2).

    .venv/bin/python bench/ttft_reuse.py [--rounds 7] [--tokens 2000]
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from werk_llamacpp.adapter import LlamaCppAdapter  # noqa: E402
from werk_llamacpp.binary import find_llama_server  # noqa: E402
from werk_llamacpp.testmodel import generate_model  # noqa: E402

from werk_host.config import HostConfig  # noqa: E402
from werk_host.models import ModelManifest, ModelRegistry  # noqa: E402
from werk_host.server import build_host  # noqa: E402
from werk_host.testing.api import Api  # noqa: E402
from werk_host.testing.hosts import running  # noqa: E402

KEY = "sk-werk-bench-ttft"


def timed(fn):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    result = fn()
    return (time.perf_counter() - start) * 1000.0, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=2000)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="werk-bench-ttft-"))
    model = generate_model(work / "bench.gguf", dim=256, layers=4, heads=8, ctx=8192)
    home = work / "home"
    home.mkdir()
    ModelRegistry(home).add(ModelManifest.from_paths("bench", [model], backend="llama.cpp"))
    server = find_llama_server()
    config = HostConfig(
        home=home,
        api_keys=(KEY,),
        model="bench",
        backend_options={"llamacpp": {"llama_server": str(server), "parallel": 2, "ctx": 8192}},
    )
    host = build_host(config)
    adapter = host.runtime.adapter
    assert isinstance(adapter, LlamaCppAdapter)
    proc = adapter.current()
    assert proc is not None and proc.slot_dir is not None
    raw = proc.new_client(timeout=600, n_slots=2)
    raw_slot = 0  # Werk's state slot is the last one

    base_words = " ".join(f"w{i % 97}x{i % 13}" for i in range(4 * args.tokens))
    tokens = raw.tokenize(base_words, add_special=True)
    text = raw.detokenize(tokens[1 : args.tokens - 20])  # leave room for the nonce

    rows: dict[str, list[float]] = {k: [] for k in ("raw_cold", "werk_cold", "werk_restored", "raw_restore")}
    evidence: list[dict[str, object]] = []
    with running(host) as base:
        api = Api(base, KEY)

        def prefill(prompt: str) -> dict[str, object]:
            status, body = api.post(
                "/werk/v1/prefill",
                {"model_id": "bench", "input": {"type": "text", "text": prompt}, "allow_experimental": True},
            )
            assert status == 200, body
            return body["data"]

        def decode(handoff: str) -> dict[str, object]:
            status, body = api.post(
                "/werk/v1/decode", {"handoff": handoff, "max_tokens": 1, "temperature": 0, "allow_experimental": True}
            )
            assert status == 200, body
            return body["data"]

        prefill("warm up " + secrets.token_hex(4))  # starts the probe outside the measurement
        for round_no in range(args.rounds + 1):
            prompt = f"[{secrets.token_hex(8)}] {text}"
            ids = raw.tokenize(prompt, add_special=True)
            # raw cold: empty slot, whole prompt computed
            raw.slot_erase(raw_slot)
            t_raw, done = timed(lambda: raw.completion(ids, id_slot=raw_slot, n_predict=1, cache_prompt=True))
            assert done.prompt_n == len(ids), done
            name = f"bench-{secrets.token_hex(6)}.bin"
            raw.slot_save(raw_slot, name)
            # werk cold: a new prompt (fresh nonce), prefill + first token
            prompt2 = f"[{secrets.token_hex(8)}] {text}"
            t_pre, data = timed(lambda: prefill(prompt2))
            t_dec, _ = timed(lambda: decode(str(data["handoff"])))
            assert data["reused"] is False
            # werk restored: the state slot was used by other work in between
            adapter.forget_slot()
            t_pre2, again = timed(lambda: prefill(prompt2))
            t_dec2, _ = timed(lambda: decode(str(again["handoff"])))
            assert again["reused"] is True and adapter.last_decode["restored"] is True
            evidence.append(dict(adapter.last_decode))
            # raw restore for reference
            raw.slot_erase(raw_slot)

            def raw_restore() -> object:
                raw.slot_restore(raw_slot, name)
                return raw.completion(ids, id_slot=raw_slot, n_predict=1, cache_prompt=True)

            t_rr, replay = timed(raw_restore)
            (proc.slot_dir / name).unlink(missing_ok=True)
            if round_no == 0:
                continue  # first round warms caches and allocators
            rows["raw_cold"].append(t_raw)
            rows["werk_cold"].append(t_pre + t_dec)
            rows["werk_restored"].append(t_pre2 + t_dec2)
            rows["raw_restore"].append(t_rr)
    host.close()

    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"llama-server {server} | model 256-dim 4-layer | prompt {len(ids)} tokens | rounds {args.rounds}")
    for key, label in (
        ("raw_cold", "raw llama-server cold prefill + 1st token"),
        ("werk_cold", "Werk prefill (disk commit) + decode 1st token"),
        ("werk_restored", "Werk reused prefill + decode 1st token (disk restore)"),
        ("raw_restore", "raw llama-server slot restore + 1st token"),
    ):
        print(f"  {label:<55} median {med[key]:9.2f} ms   runs {[round(x, 1) for x in rows[key]]}")
    print(f"  restore evidence (last round): {evidence[-1]}")
    ratio = med["werk_restored"] / med["raw_cold"]
    print(f"RATIO werk_restored / raw_cold = {ratio:.3f}  (target <= 0.2)")
    return 0 if os.environ.get("WERK_BENCH_STRICT") != "1" or ratio <= 0.2 else 1


if __name__ == "__main__":
    sys.exit(main())
