"""Tests for engine-worker backends (docs/plugin-kit.md, "Engine workers"): the rules every
:class:`~werk_host.plugin.engines.EngineAdapter` backend must keep, run on its real engine.

* :func:`engine_python` and :func:`skip_without_engine`: the engine interpreter named by an
  environment variable, and the ``engine`` marker's skip (naming the variable) where it is not.
* :func:`assert_model_cache_size`: the LRU capacity's environment variable, checked;
  :func:`restart_worker`: the conformance suite's ``replace_process`` for these adapters.
* :class:`EngineWorkerSuite`: subclass it in a test module (``class TestWorkers(EngineWorkerSuite)``,
  marked ``engine``) with a fixture ``engine_worker_target`` returning an
  :class:`EngineWorkerTarget`; it checks streaming usage against the exact count, one worker per
  exact model (shared by name, another for a changed file), the LRU bound (least recently used
  idle worker stopped first), the forced-``tool_choice`` refusal and the missing-interpreter error.
* :func:`serve_dies_with_werk`: ``werk serve`` answers ``/v1/chat/completions`` (streamed usage
  equal to ``/werk/v1/chat/count_tokens``) through the backend's worker, and the worker dies with
  ``werk serve`` when that is SIGKILLed; :func:`werk_command` runs ``werk`` in a home of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import JsonValue

from werk_host.plugin import (
    Adapter,
    CapabilityId,
    CapabilityStatus,
    ChatRequest,
    HostConfig,
    JsonObject,
    ModelManifest,
    WerkError,
)
from werk_host.plugin.engines import EngineAdapter

__all__ = [
    "EngineWorkerSuite",
    "EngineWorkerTarget",
    "assert_model_cache_size",
    "engine_python",
    "restart_worker",
    "serve_dies_with_werk",
    "skip_without_engine",
    "werk_command",
]

MESSAGES: list[JsonObject] = [{"role": "user", "content": "Say hello to the assistant."}]


def engine_python(env: str) -> str | None:
    """The engine interpreter the environment variable ``env`` names, when it is a file."""
    python = os.environ.get(env)
    return python if python and Path(python).is_file() else None


def skip_without_engine(items: list[pytest.Item], env: str, setup: str) -> None:
    """For ``pytest_collection_modifyitems``: skip the ``engine``-marked tests when ``env`` names
    no interpreter (``setup``: the command that makes one)."""
    if engine_python(env) is None:
        skip = pytest.mark.skip(reason=f"{env} names no engine interpreter ({setup})")
        for item in items:
            if "engine" in item.keywords:
                item.add_marker(skip)


@dataclass(frozen=True)
class EngineWorkerTarget:
    """The backend under test, for :class:`EngineWorkerSuite`."""

    create: Callable[[HostConfig, ModelManifest | None], EngineAdapter]
    #: The manifest of a model directory, under a name.
    manifest: Callable[[Path, str], ModelManifest]
    model: Path
    #: Another model (other weights), made on demand.
    other_model: Callable[[], Path]
    #: A file of the model directory; a copy with it changed is another model.
    config_file: str
    #: The backend's options (``{backend: {"python": ..., ...}}``).
    backend_options: dict[str, dict[str, JsonValue]]
    cache_size_env: str
    python_env: str


def assert_model_cache_size(cache_size: Callable[[dict[str, str]], int], name: str) -> None:
    """The model LRU's capacity from the environment variable ``name``: 1 when unset, a positive
    integer, anything else refused naming the variable."""
    assert cache_size({}) == 1
    assert cache_size({name: "3"}) == 3
    for bad in ("0", "-1", "two"):
        with pytest.raises(ValueError, match=name):
            cache_size({name: bad})


def restart_worker(adapter: Adapter) -> None:
    """The conformance suite's ``replace_process``: kill the worker and start a new one (a new
    process generation)."""
    assert isinstance(adapter, EngineAdapter)
    adapter.restart()


def _chat(adapter: EngineAdapter, **extra: JsonValue) -> bytes:
    body: JsonObject = {"model": "m", "messages": list(MESSAGES), "max_tokens": 5, "temperature": 0, **extra}
    response = adapter.chat_completion(body)
    try:
        assert response.status == 200
        return b"".join(response.body)
    finally:
        response.close()


def _resident(adapter: EngineAdapter) -> bool:
    return adapter.capabilities()[CapabilityId.MODEL_RESIDENCY].status is CapabilityStatus.SUPPORTED


class EngineWorkerSuite:
    """The engine-worker rules on the real engine (module docstring)."""

    @pytest.fixture
    def config(self, tmp_path: Path, engine_worker_target: EngineWorkerTarget) -> HostConfig:
        return HostConfig(home=tmp_path / "home", backend_options=engine_worker_target.backend_options)

    @pytest.fixture
    def adapters(self) -> Iterator[list[EngineAdapter]]:
        made: list[EngineAdapter] = []
        yield made
        for adapter in made:
            adapter.close()

    def test_stream_carries_usage_equal_to_the_exact_count(
        self, engine_worker_target: EngineWorkerTarget, config: HostConfig, adapters: list[EngineAdapter]
    ) -> None:
        target = engine_worker_target
        adapter = target.create(config, target.manifest(target.model, "tiny"))
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
        self,
        engine_worker_target: EngineWorkerTarget,
        config: HostConfig,
        tmp_path: Path,
        adapters: list[EngineAdapter],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        target = engine_worker_target
        monkeypatch.setenv(target.cache_size_env, "2")
        first = target.create(config, target.manifest(target.model, "a"))
        adapters.append(first)
        second = target.create(config, target.manifest(target.model, "b"))
        adapters.append(second)
        assert first.slot is second.slot and first.slot.generation() is not None
        changed = tmp_path / "changed"
        shutil.copytree(target.model, changed)
        config_file = changed / target.config_file
        config_file.write_text(config_file.read_text() + "\n")
        third = target.create(config, target.manifest(changed, "c"))
        adapters.append(third)
        assert third.slot is not first.slot
        assert third.slot.generation() not in (None, first.slot.generation())
        assert _resident(first) and _resident(third)

    def test_the_lru_stops_the_least_recently_used_model(
        self,
        engine_worker_target: EngineWorkerTarget,
        config: HostConfig,
        adapters: list[EngineAdapter],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        target = engine_worker_target
        monkeypatch.setenv(target.cache_size_env, "1")
        old = target.create(config, target.manifest(target.model, "old"))
        adapters.append(old)
        before = old.identity()
        new = target.create(config, target.manifest(target.other_model(), "new"))
        adapters.append(new)
        assert _resident(new) and not _resident(old)
        assert old.identity() != before
        _chat(old)  # the next request loads it again, and the other one makes room
        assert _resident(old) and not _resident(new)
        assert old.identity() not in (before, new.identity())

    def test_a_forced_tool_call_is_refused_not_ignored(
        self, engine_worker_target: EngineWorkerTarget, config: HostConfig, adapters: list[EngineAdapter]
    ) -> None:
        target = engine_worker_target
        adapter = target.create(config, target.manifest(target.model, "tiny"))
        adapters.append(adapter)
        tools: list[JsonValue] = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        with pytest.raises(WerkError, match="tool_choice"):
            _chat(adapter, tools=tools, tool_choice="required")

    def test_a_missing_engine_interpreter_is_named(
        self, engine_worker_target: EngineWorkerTarget, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        target = engine_worker_target
        monkeypatch.delenv(target.python_env, raising=False)
        with pytest.raises(WerkError, match=target.python_env):
            target.create(HostConfig(home=tmp_path), target.manifest(target.model, "tiny"))


def werk_command(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``werk ARGS`` (this interpreter's ``python -m werk_host``) with ``WERK_HOME=home`` and ``env``."""
    environ = {**os.environ, "WERK_HOME": str(home), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "werk_host", *args], capture_output=True, text=True, env=environ, timeout=120
    )


def _post(url: str, key: str, body: object) -> bytes:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        data: bytes = answer.read()
        return data


def _workers_of(worker: Path, model: Path) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(worker).encode() in argv and str(model).encode() in argv:
            found.append(int(proc.name))
    return found


def serve_dies_with_werk(
    home: Path,
    model: Path,
    *,
    worker: Path,
    env: dict[str, str],
    add: tuple[str, ...] = (),
    serve: tuple[str, ...] = (),
) -> None:
    """Register ``model`` (``werk models add tiny MODEL *add``), run ``werk serve --model tiny
    *serve`` with ``env`` added to its environment, check a streamed chat's usage against
    ``count_tokens`` and that a process runs ``worker`` for ``model`` (found through ``/proc``),
    then SIGKILL ``werk serve`` and check that no such process is left within 30 seconds."""
    key = "sk-engine-worker-" + "t" * 24
    assert werk_command(home, "models", "add", "tiny", str(model), *add).returncode == 0
    environ = {**os.environ, "WERK_HOME": str(home), "WERK_API_KEYS": key, **env}
    argv = [sys.executable, "-m", "werk_host", "serve", "--port", "0", "--model", "tiny", *serve]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=environ, text=True)
    try:
        assert process.stdout is not None
        base = f"http://127.0.0.1:{json.loads(process.stdout.readline())['port']}"
        messages = [{"role": "user", "content": "Hello there"}]
        body = {"model": "tiny", "messages": messages, "max_tokens": 4, "temperature": 0, "stream": True}
        raw = _post(f"{base}/v1/chat/completions", key, {**body, "stream_options": {"include_usage": True}}).decode()
        events = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        usage = json.loads(events[-2])["usage"]
        counted = json.loads(_post(f"{base}/werk/v1/chat/count_tokens", key, {"model": "tiny", "messages": messages}))
        assert counted["data"]["input_tokens"] == usage["prompt_tokens"] > 0
        assert _workers_of(worker, model)  # the worker (and, under the group guard, its guard process)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    deadline = time.monotonic() + 30
    while _workers_of(worker, model) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _workers_of(worker, model) == []
