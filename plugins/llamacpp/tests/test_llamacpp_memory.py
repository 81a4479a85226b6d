"""The memory an instance needs before its first start (docs/deployments.md, "Memory estimate"):
the KV cache of its configured context from the GGUF header, in the cache types and with the
sliding-window layers llama-server allocates, and the share of its layers ``-ngl`` puts on an
accelerator; then residency over real llama-server children uses it: a start that fits only once
an idle instance is unloaded unloads it, one that can never fit is refused with the figures.

The arithmetic is checked against the real SmolLM2 header (30 layers, 3 KV heads of 64) and
headers written with the ``gguf`` package's own writer.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import pytest
from werk_llamacpp import plugin as llama_plugin
from werk_llamacpp.footprint import memory_estimate
from werk_llamacpp.gguf_meta import KvShape, kv_bytes_per_token, kv_cache_bytes, kv_shape, read_metadata

from werk_host.plugin import HostConfig, ModelManifest
from werk_host.testing.api import Api
from werk_host.testing.host import Host, ModelRegistry
from werk_host.testing.hosts import make_host, running
from werk_host.testing.memory import OVERHEAD_BYTES, SnapshotPool, snapshot_memory

MIB = 1 << 20
GIB = 1 << 30
#: SmolLM2-135M: 30 layers x 3 KV heads x (64 + 64) elements, f16
SMOL_TOKEN = 30 * 3 * 128 * 2


def _header(path: Path, arch: str, **keys: int) -> Path:
    """A GGUF holding only a header: ``arch``'s attention keys (``layers``, ``heads``,
    ``kv_heads``, ``head``, and ``sliding_window``/``pattern`` when given)."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(keys["layers"])
    writer.add_head_count(keys["heads"])
    writer.add_head_count_kv(keys["kv_heads"])
    writer.add_embedding_length(keys["heads"] * keys["head"])
    writer.add_key_length(keys["head"])
    writer.add_value_length(keys["head"])
    writer.add_context_length(32768)
    if "sliding_window" in keys:
        writer.add_sliding_window(keys["sliding_window"])
    if "pattern" in keys:
        writer.add_uint32(f"{arch}.attention.sliding_window_pattern", keys["pattern"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_smollm2_kv_from_its_header_in_each_cache_type(smollm2_gguf: Path) -> None:
    meta = read_metadata(smollm2_gguf)
    shape = kv_shape(meta)
    assert shape == KvShape(layers=30, kv_heads=3, key_length=64, value_length=64)
    assert kv_bytes_per_token(meta) == SMOL_TOKEN
    # q8_0: blocks of 32 elements in 34 bytes; 192 elements a row -> 6 blocks
    assert kv_bytes_per_token(meta, "q8_0", "q8_0") == 30 * 2 * 6 * 34
    assert kv_bytes_per_token(meta, "f16", "q4_0") == 30 * (192 * 2 + 6 * 18)
    assert kv_bytes_per_token(meta, "f32", "f32") == 2 * SMOL_TOKEN
    assert shape is not None
    # every layer is full attention: the whole context, however it is split over slots
    assert kv_cache_bytes(shape, 16384, 2) == 16384 * SMOL_TOKEN
    assert kv_cache_bytes(shape, 16384, 4, unified=True) == 16384 * SMOL_TOKEN


def test_sliding_window_layers_hold_the_window_unless_swa_full(tmp_path: Path) -> None:
    # gemma3 layers come in sixes, five windowed then one full (its header names no pattern)
    shape = kv_shape(
        read_metadata(
            _header(tmp_path / "g3.gguf", "gemma3", layers=12, heads=4, kv_heads=2, head=64, sliding_window=512)
        )
    )
    assert shape == KvShape(12, 2, 64, 64, window=512, window_layers=10)
    cell = 2 * (2 * 64) * 2  # K and V rows of 2 heads x 64, f16
    # per slot: min(8192, 512 + 512 micro-batch) cells, rounded up to 256 -> 1024; two slots
    assert kv_cache_bytes(shape, 16384, 2) == cell * (2 * 16384 + 10 * 2 * 1024)
    assert kv_cache_bytes(shape, 16384, 2, swa_full=True) == cell * 12 * 16384
    assert kv_cache_bytes(shape, 16384, 2, unified=True) == cell * (2 * 16384 + 10 * 1536)
    assert kv_cache_bytes(shape, 16384, 2, ubatch=1000) == cell * (2 * 16384 + 10 * 2 * 1536)
    assert kv_cache_bytes(shape, 600, 2) == cell * (2 * 600 + 10 * 2 * 512)  # a slot's context is less
    # the header's own pattern wins: of every 4 layers 3 windowed
    own = _header(
        tmp_path / "p4.gguf", "gemma3", layers=12, heads=4, kv_heads=2, head=64, sliding_window=512, pattern=4
    )
    assert kv_shape(read_metadata(own)) == KvShape(12, 2, 64, 64, window=512, window_layers=9)
    # a window without a known pattern counts every layer as full (an upper bound)
    odd = _header(tmp_path / "odd.gguf", "llama", layers=4, heads=4, kv_heads=4, head=16, sliding_window=256)
    assert kv_shape(read_metadata(odd)) == KvShape(4, 4, 16, 16)


def _manifest(path: Path) -> ModelManifest:
    return ModelManifest.from_paths("smollm2", [path], backend="llama.cpp")


def _config(tmp_path: Path, **options: Any) -> HostConfig:
    return HostConfig(home=tmp_path, backend_options={"llamacpp": options})


def test_the_factory_estimates_the_configured_context_and_placement(
    tmp_path: Path, smollm2_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = _manifest(smollm2_gguf)
    estimate = memory_estimate(_config(tmp_path, ctx=8192, parallel=2), manifest)
    assert estimate is not None
    assert (estimate.kv_bytes, estimate.context_tokens, estimate.accelerator_share) == (8192 * SMOL_TOKEN, 8192, 0.0)
    # without ctx: parallel x the trained context (8192), where memory allows
    default = memory_estimate(_config(tmp_path, parallel=3), manifest)
    assert default is not None and default.context_tokens == 3 * 8192 and default.kv_bytes == 3 * 8192 * SMOL_TOKEN
    # WERK_LLAMA_ARGS is the end of the child's command line: its flags win
    monkeypatch.setenv("WERK_LLAMA_ARGS", "-c 4096 --cache-type-k q8_0 -ctv q8_0 -ngl 15")
    tuned = memory_estimate(_config(tmp_path, ctx=8192, parallel=2), manifest)
    assert tuned is not None
    assert (tuned.kv_bytes, tuned.context_tokens) == (4096 * 30 * 2 * 6 * 34, 4096)
    assert tuned.accelerator_share == 15 / 31  # 30 blocks and the output layer
    monkeypatch.setenv("WERK_LLAMA_ARGS", "--n-gpu-layers all")
    every = memory_estimate(_config(tmp_path, ctx=8192), manifest)
    assert every is not None and every.accelerator_share == 1.0
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 16)
    assert memory_estimate(_config(tmp_path), _manifest(garbage)) is None


PROFILE = """
[[instance]]
id = "small"
model = "smollm2"
options = { ctx = 2048 }

[[instance]]
id = "large"
model = "smollm2"
options = { ctx = 8192 }

[[instance]]
id = "huge"
model = "smollm2"
options = { ctx = 1000000 }
"""


@pytest.fixture
def served(tmp_path: Path, llama_server_path: Path, smollm2_gguf: Path) -> Iterator[tuple[Host, str, SnapshotPool]]:
    """A host serving three SmolLM2 instances whose host memory telemetry shows ``pool`` less
    the estimates (taken before any start) of the instances loaded."""
    home = tmp_path / "home"
    home.mkdir()
    ModelRegistry(home).add(_manifest(smollm2_gguf))
    profile = tmp_path / "deployments.toml"
    profile.write_text(PROFILE)
    pool = SnapshotPool(64 * GIB, 0)
    host = make_host(
        home,
        plugin=llama_plugin,
        plugin_name="llamacpp",
        with_model=False,
        profile=profile,
        backend_options={"llama_server": str(llama_server_path)},
        memory=snapshot_memory(pool),
    )
    deployments = host.fleet.deployments
    assert deployments is not None
    before = {i.id: deployments.residency.estimate(i) for i in deployments.instances.values()}
    loaded = ("ready", "unloading")
    pool.held = lambda: sum(before[i.id] for i in deployments.instances.values() if i.view().status in loaded)
    with running(host) as url:
        yield host, url, pool


def _chat(api: Api, model: str) -> tuple[int, Any]:
    return api.post(
        "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    )


def _inventory(api: Api) -> dict[str, dict[str, Any]]:
    status, doc = api.get("/werk/v1/deployments")
    assert status == 200, doc
    return {i["id"]: i for i in doc["data"]["inventory"]}


@pytest.mark.llamaserver
def test_residency_makes_room_by_the_estimate_and_refuses_with_the_figures(
    served: tuple[Host, str, SnapshotPool], smollm2_gguf: Path
) -> None:
    host, url, pool = served
    api = Api(url)
    weights = smollm2_gguf.stat().st_size
    need = {
        name: weights + ctx * SMOL_TOKEN + OVERHEAD_BYTES
        for name, ctx in (("small", 2048), ("large", 8192), ("huge", 1000000))
    }
    assert {k: v["memory_estimate_bytes"] for k, v in _inventory(api).items()} == need  # before any start
    pool.available = need["small"] + need["large"] - 1  # one or the other, never both
    assert _chat(api, "small")[0] == 200
    assert _chat(api, "large")[0] == 200
    states = {k: v["state"] for k, v in _inventory(api).items()}
    assert states == {"small": "cold", "large": "ready", "huge": "cold"}
    status, logs = api.get("/werk/v1/deployments/small/logs")
    assert any("unloaded to load large (memory)" in line for line in logs["data"]["lines"]), logs

    status, body = _chat(api, "huge")
    assert status == 429 and body["error"]["code"] == "resource_exhausted", body
    message = body["error"]["message"]
    kv = 1000000 * SMOL_TOKEN
    assert (
        f"instance huge needs about {need['huge'] >> 20} MiB of host memory (model files {weights >> 20} MiB" in message
    )
    assert f"KV cache {kv >> 20} MiB for 1000000 tokens + overhead 256 MiB)" in message, message
    assert "from unloading large;" in message, message
    assert _inventory(api)["large"]["state"] == "ready"  # refused at once: nothing was unloaded for it

    # once it has run, what its llama-server holds replaces the estimate
    deployments = host.fleet.deployments
    assert deployments is not None
    large = deployments.instances["large"]
    pid = _inventory(api)["large"]["pid"]
    deployments.residency.measure(large, [pid])
    after = deployments.residency.footprint(large)
    assert "resident when it last ran" in after.detail and after.host >= weights
    assert _inventory(api)["large"]["memory_estimate_bytes"] == after.total
