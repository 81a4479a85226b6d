"""Expert offload on real MLX, in this process: the offloaded model against stock mlx-lm.

Budgets are in bytes here (the store's unit); the tiny model's experts are 384 KiB each in
float32 and 60 KiB in 4 bits, eight per layer, four layers.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.mlx

KIB = 1024
PROMPT = "Werk keeps the hot experts in memory and reads the cold ones from disk when a router picks them. " * 2


def load_stock(model_dir: Path) -> tuple[Any, Any]:
    from mlx_lm import load

    return load(str(model_dir))


def load_offloaded(model_dir: Path, budget: int) -> tuple[Any, Any]:
    import mlx.core as mx
    from mlx_lm.utils import load_model
    from werk_omlx.worker.offload import install_offload
    from werk_omlx.worker.tensors import read_index

    model, _ = load_model(model_dir, lazy=True)
    store = install_offload(model, read_index(model_dir), budget)
    mx.eval(model.parameters())
    return model, store


def prompt_tokens(tokenizer: Any) -> list[int]:
    return list(tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True))


def greedy(model: Any, tokenizer: Any, tokens: list[int], n: int = 24) -> str:
    from mlx_lm import generate

    return str(generate(model, tokenizer, tokens, max_tokens=n))


def expert_bytes(store: Any) -> int:
    return int(store.size((0, 0)))


@pytest.mark.parametrize("which", ["f32", "q4"])
def test_offloaded_output_is_identical_to_stock_mlx_lm(which: str, request: pytest.FixtureRequest) -> None:
    import mlx.core as mx

    model_dir: Path = request.getfixturevalue(f"moe_{which}")
    stock, tokenizer = load_stock(model_dir)
    tokens = prompt_tokens(tokenizer)
    assert len(tokens) * 2 >= 64  # the prefill takes the sorted gather path, decoding the unsorted one
    reference_logits = stock(mx.array([tokens]))
    reference_text = greedy(stock, tokenizer, tokens)
    mx.eval(reference_logits)

    offloaded, store = load_offloaded(model_dir, budget=2 * expert_bytes_of(model_dir))
    logits = offloaded(mx.array([tokens]))
    mx.eval(logits)
    assert mx.array_equal(logits, reference_logits).item()  # bit for bit
    assert greedy(offloaded, tokenizer, tokens) == reference_text
    assert store.counters.misses > 0 and store.counters.evictions > 0  # it really ran from the LRU


def expert_bytes_of(model_dir: Path) -> int:
    from werk_omlx.worker.offload import switch_blocks  # noqa: F401 - MLX is importable here
    from werk_omlx.worker.tensors import read_index

    index = read_index(model_dir)
    stacked = index.get("model.layers.0.mlp.switch_mlp.up_proj.weight")
    if stacked is not None:  # quantized: weight, scales and biases of three projections
        parts = [v for k, v in index.items() if k.startswith("model.layers.0.mlp.switch_mlp.")]
        return sum(p.nbytes for p in parts) // stacked.shape[0]
    return sum(v.nbytes for k, v in index.items() if k.startswith("model.layers.0.mlp.experts.0."))


@pytest.mark.parametrize("experts", [1, 3, 5, 40])
def test_resident_bytes_stay_within_budget_plus_one_layer_working_set(moe_f32: Path, experts: int) -> None:
    size = expert_bytes_of(moe_f32)
    budget = experts * size
    model, store = load_offloaded(moe_f32, budget)
    _, tokenizer = load_stock(moe_f32)
    greedy(model, tokenizer, prompt_tokens(tokenizer), n=16)
    c = store.counters
    assert c.max_working_set_bytes > 0
    assert c.peak_resident_bytes <= budget + c.max_working_set_bytes
    if budget >= 32 * size:  # everything fits: nothing is ever evicted
        assert c.evictions == 0 and c.peak_resident_bytes <= budget
    else:
        assert c.evictions > 0
    assert c.loaded_bytes == c.misses * size  # every miss read exactly one expert from disk
    assert c.evictions == c.misses - store.snapshot()["resident_experts"]


def test_a_warm_cache_hits_and_reads_nothing_more(moe_q4: Path) -> None:
    model, store = load_offloaded(moe_q4, budget=64 * expert_bytes_of(moe_q4))
    _, tokenizer = load_stock(moe_q4)
    tokens = prompt_tokens(tokenizer)
    first = greedy(model, tokenizer, tokens, n=8)
    misses, hits = store.counters.misses, store.counters.hits
    assert misses <= 32
    assert greedy(model, tokenizer, tokens, n=8) == first
    assert store.counters.hits > hits
    assert store.counters.misses == misses  # the same route: every expert was already resident


def test_pins_survive_pressure_and_capacity_bounds_pins(moe_f32: Path) -> None:
    from werk_omlx.worker.offload import CapacityError, PinnedError

    size = expert_bytes_of(moe_f32)
    model, store = load_offloaded(moe_f32, budget=5 * size)
    _, tokenizer = load_stock(moe_f32)
    pinned = [(0, 3), (2, 6)]
    plan = store.pin(pinned, dry_run=False)
    assert set(plan.pin) == set(pinned) and set(plan.load) == set(pinned)
    greedy(model, tokenizer, prompt_tokens(tokenizer), n=12)
    assert store.counters.evictions > 0  # there was pressure
    views = {(v.layer, v.expert): v for v in store.view()}
    assert all(views[k].resident and views[k].pinned for k in pinned)
    before = store.view()
    with pytest.raises(CapacityError):  # 2 pinned + 4 more > 5 experts
        store.pin([(1, 0), (1, 1), (1, 2), (1, 3)], dry_run=False)
    with pytest.raises(CapacityError):  # a prefetch must fit beside the pins too
        store.prefetch([(3, 0), (3, 1), (3, 2), (3, 3)], dry_run=False)
    with pytest.raises(PinnedError):
        store.evict([pinned[0]], dry_run=False)
    assert store.view() == before  # refused actions changed nothing


def test_dry_runs_change_nothing_and_predict_the_real_plan(moe_f32: Path) -> None:
    size = expert_bytes_of(moe_f32)
    model, store = load_offloaded(moe_f32, budget=4 * size)
    _, tokenizer = load_stock(moe_f32)
    greedy(model, tokenizer, prompt_tokens(tokenizer), n=4)
    want = [(3, 7), (0, 1)]
    for action in ("prefetch", "pin", "unpin", "evict"):
        before, counters = store.view(), store.snapshot()
        planned = getattr(store, action)(want, dry_run=True)
        assert store.view() == before and store.snapshot() == counters
        done = getattr(store, action)(want, dry_run=False)
        assert done == planned
    views = {(v.layer, v.expert): v for v in store.view()}
    assert not any(views[k].resident or views[k].pinned for k in want)


def test_eviction_keeps_the_checkpoint_and_experts_reload_from_it(moe_f32: Path) -> None:
    weights = moe_f32 / "model.safetensors"
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    model, store = load_offloaded(moe_f32, budget=40 * expert_bytes_of(moe_f32))
    _, tokenizer = load_stock(moe_f32)
    tokens = prompt_tokens(tokenizer)
    first = greedy(model, tokenizer, tokens, n=8)
    resident = [(v.layer, v.expert) for v in store.view() if v.resident]
    plan = store.evict(resident, dry_run=False)
    assert set(plan.evict) == set(resident) and store.snapshot()["resident_bytes"] == 0
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == digest
    misses = store.counters.misses
    assert greedy(model, tokenizer, tokens, n=8) == first
    assert store.counters.misses > misses


def test_a_checkpoint_without_the_expert_tensors_is_refused_whole(moe_f32: Path) -> None:
    from mlx_lm.utils import load_model
    from werk_omlx.worker.offload import install_offload, switch_blocks
    from werk_omlx.worker.tensors import LayoutError, read_index

    model, _ = load_model(moe_f32, lazy=True)
    index = {k: v for k, v in read_index(moe_f32).items() if ".experts.5." not in k}
    with pytest.raises(LayoutError):
        install_offload(model, index, 1 << 20)
    assert len(switch_blocks(model)) == 4  # nothing was replaced


def test_the_generator_writes_both_layouts_quickly(tmp_path: Path) -> None:
    import time

    from werk_omlx.testing.testmodel import TINY, generate
    from werk_omlx.worker.tensors import read_index

    started = time.monotonic()
    f32 = generate(tmp_path / "f32", TINY, seed=3)
    elapsed = time.monotonic() - started
    names = set(read_index(f32))
    assert "model.layers.3.mlp.experts.7.down_proj.weight" in names
    q4 = generate(tmp_path / "q4", TINY, seed=3, bits=4)
    stacked = read_index(q4)["model.layers.0.mlp.switch_mlp.up_proj.weight"]
    assert stacked.dtype == "U32" and stacked.shape[0] == TINY.experts
    print(f"\n[werk-omlx] float32 fixture generated in {elapsed:.2f}s")
