"""Workers on the real engine (a new generator per request, nothing shared between requests): one per exact model (checksum-sensitive), shared by adapters of
the same model, bounded by WERK_ONNX_GENAI_MODEL_CACHE_SIZE (least recently used idle worker
stopped first), serialized, streaming with usage equal to the exact count."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from werk_onnx_genai.adapter import OnnxGenaiAdapter, create_adapter, genai_dir
from werk_onnx_genai.settings import CACHE_SIZE_ENV
from werk_onnx_genai.testing import tiny_genai_model

from werk_host.plugin import (
    CapabilityId,
    CapabilityStatus,
    ChatRequest,
    HostConfig,
    JsonObject,
    ModelManifest,
    WerkError,
)
from werk_host.plugin.checkpoints import checkpoint_files

pytestmark = pytest.mark.engine
MESSAGES: list[JsonObject] = [{"role": "user", "content": "Say hello to the assistant."}]


@pytest.fixture
def config(tmp_path: Path, engine: str) -> HostConfig:
    return HostConfig(home=tmp_path / "home", backend_options={"onnx-genai": {"python": engine}})


@pytest.fixture
def adapters() -> Iterator[list[OnnxGenaiAdapter]]:
    made: list[OnnxGenaiAdapter] = []
    yield made
    for adapter in made:
        adapter.close()


def _manifest(directory: Path, name: str) -> ModelManifest:
    manifest = ModelManifest.from_paths(name, checkpoint_files(directory))
    assert genai_dir(manifest) == directory
    return manifest


def _chat(adapter: OnnxGenaiAdapter, **extra: object) -> bytes:
    body: JsonObject = {"model": "m", "messages": list(MESSAGES), "max_tokens": 5, "temperature": 0, **extra}  # type: ignore[dict-item]
    response = adapter.chat_completion(body)
    try:
        assert response.status == 200
        return b"".join(response.body)
    finally:
        response.close()


def _resident(adapter: OnnxGenaiAdapter) -> bool:
    return adapter.capabilities()[CapabilityId.MODEL_RESIDENCY].status is CapabilityStatus.SUPPORTED


def test_stream_carries_usage_equal_to_the_exact_count(
    config: HostConfig, genai_model: Path, adapters: list[OnnxGenaiAdapter]
) -> None:
    adapter = create_adapter(config, _manifest(genai_model, "tiny"))
    adapters.append(adapter)
    raw = _chat(adapter, stream=True, stream_options={"include_usage": True})
    events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage["completion_tokens"] <= 5
    assert usage["prompt_tokens"] == adapter.count_tokens(ChatRequest.model_validate({"messages": MESSAGES}))
    whole = json.loads(_chat(adapter))
    assert whole["choices"][0]["message"]["content"] == text  # greedy: the same answer either way
    assert whole["usage"] == usage


def test_same_model_shares_a_worker_and_a_changed_file_is_another_model(
    config: HostConfig,
    genai_model: Path,
    tmp_path: Path,
    adapters: list[OnnxGenaiAdapter],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CACHE_SIZE_ENV, "2")
    first = create_adapter(config, _manifest(genai_model, "a"))
    adapters.append(first)
    second = create_adapter(config, _manifest(genai_model, "b"))
    adapters.append(second)
    assert first.slot is second.slot and first.slot.generation() is not None
    changed = tmp_path / "changed"
    shutil.copytree(genai_model, changed)
    config_json = changed / "genai_config.json"
    config_json.write_text(config_json.read_text() + "\n")
    third = create_adapter(config, _manifest(changed, "c"))
    adapters.append(third)
    assert third.slot is not first.slot
    assert third.slot.generation() not in (None, first.slot.generation())
    assert _resident(first) and _resident(third)


def test_the_lru_stops_the_least_recently_used_model(
    config: HostConfig,
    engine: str,
    genai_model: Path,
    adapters: list[OnnxGenaiAdapter],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CACHE_SIZE_ENV, "1")
    old = create_adapter(config, _manifest(genai_model, "old"))
    adapters.append(old)
    before = old.identity()
    new = create_adapter(config, _manifest(tiny_genai_model(engine, seed=1), "new"))
    adapters.append(new)
    assert _resident(new) and not _resident(old)
    assert old.identity() != before
    _chat(old)  # the next request loads it again, and the other one makes room
    assert _resident(old) and not _resident(new)
    assert old.identity() not in (before, new.identity())


def test_a_forced_tool_call_is_refused_not_ignored(
    config: HostConfig, genai_model: Path, adapters: list[OnnxGenaiAdapter]
) -> None:
    adapter = create_adapter(config, _manifest(genai_model, "tiny"))
    adapters.append(adapter)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with pytest.raises(WerkError, match="tool_choice"):
        _chat(adapter, tools=tools, tool_choice="required")


def test_a_missing_engine_interpreter_is_named(
    tmp_path: Path, genai_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WERK_ONNX_GENAI_PYTHON", raising=False)
    with pytest.raises(WerkError, match="WERK_ONNX_GENAI_PYTHON"):
        create_adapter(HostConfig(home=tmp_path), _manifest(genai_model, "tiny"))
