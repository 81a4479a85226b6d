"""The managed-process and remote machinery against a stand-in vllm (``fake_vllm.py``): no vLLM needed.

What a real vLLM adds (its template, tokenizer, prefix cache and metrics) is checked in the
``vllm``-marked modules; here it is the plugin's own behaviour: which argv and environment it
starts, the flag check before spawning, the on-disk flag cache, sharing one process across
adapters, restarting a dead one, redacted startup failures, and remote endpoints with keys.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vllm_helpers import FAKE_VLLM, model_manifest, records
from werk_vllm import plugin
from werk_vllm import server as servers
from werk_vllm.adapter import VllmAdapter, create_adapter
from werk_vllm.apc import APC_ON
from werk_vllm.executable import clear_memory_cache, inspect_vllm
from werk_vllm.server import VllmStartupError

from werk_host.plugin import (
    CapabilityId,
    CapabilityStatus,
    ChatRequest,
    EmbeddingWork,
    EndpointKind,
    ErrorCode,
    HostConfig,
    InferenceResponse,
    ModelManifest,
    PersistenceDefaults,
    RerankWork,
    WerkError,
)
from werk_host.plugin.process import free_port
from werk_host.testing.api import Api
from werk_host.testing.host import ModelRegistry, PluginHost, build_host
from werk_host.testing.hosts import running
from werk_host.testing.processes import gone

REMOTE_KEY = "sk-remote-fake-7731"


def config(tmp_path: Path, persistence: PersistenceDefaults | None = None, **options: Any) -> HostConfig:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return HostConfig(home=home, persistence=persistence, backend_options={"vllm": dict(options)})


def body_of(response: InferenceResponse) -> bytes:
    try:
        return b"".join(response.body)
    finally:
        response.close()


@pytest.fixture(autouse=True)
def _fresh_inspections() -> Iterator[None]:
    clear_memory_cache()
    yield
    clear_memory_cache()
    assert not servers.shared_servers(), "a test left a shared vLLM server behind"


@pytest.fixture
def adapters() -> Iterator[list[VllmAdapter]]:
    made: list[VllmAdapter] = []
    yield made
    for adapter in made:
        adapter.close()


# -- before anything runs ---------------------------------------------------------------------------


def test_a_missing_executable_is_a_typed_unavailable(
    tmp_path: Path, fake_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WERK_VLLM", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    for options in ({}, {"executable": str(tmp_path / "no" / "vllm")}):
        with pytest.raises(WerkError) as err:
            create_adapter(config(tmp_path, **options), model_manifest(fake_model))
        assert err.value.code is ErrorCode.UNAVAILABLE and not err.value.retryable
        assert "WERK_VLLM" in err.value.message and str(tmp_path) not in err.value.message


def test_a_flag_the_installed_vllm_lacks_is_refused_before_spawning(
    tmp_path: Path, fake_vllm: Path, fake_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_VLLM_DROP", "--max-num-seqs")
    monkeypatch.setenv("FAKE_VLLM_VERSION", "0.1.0")
    cfg = config(tmp_path, executable=str(fake_vllm), max_num_seqs=4)
    with pytest.raises(WerkError) as err:
        create_adapter(cfg, model_manifest(fake_model))
    assert err.value.code is ErrorCode.UNAVAILABLE and not err.value.retryable
    assert "--max-num-seqs" in err.value.message and "0.1.0" in err.value.message
    assert "incompatible" in err.value.message
    assert records(tmp_path / "records", "spawn") == []  # nothing was started


def test_the_flag_set_is_cached_on_disk_by_path_size_and_mtime(tmp_path: Path, fake_vllm: Path) -> None:
    cache = tmp_path / "home" / "backends" / "vllm" / "flags"
    first = inspect_vllm(fake_vllm, cache)
    assert "--max-num-seqs" in first.flags and first.version == "0.0.0+fake"
    clear_memory_cache()
    again = inspect_vllm(fake_vllm, cache)
    assert again == first
    assert len(records(tmp_path / "records", "inspect")) == 1  # the second came from disk
    assert oct(cache.stat().st_mode & 0o777) == "0o700"
    os.utime(fake_vllm, ns=(time.time_ns(), time.time_ns() + 10**9))  # a replaced executable
    clear_memory_cache()
    inspect_vllm(fake_vllm, cache)
    assert len(records(tmp_path / "records", "inspect")) == 2


def test_werk_vllm_args_must_not_carry_an_api_key(
    tmp_path: Path, fake_vllm: Path, fake_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WERK_VLLM_ARGS", "--api-key sk-mine")
    with pytest.raises(WerkError) as err:
        create_adapter(config(tmp_path, executable=str(fake_vllm)), model_manifest(fake_model))
    assert err.value.code is ErrorCode.INVALID_REQUEST and "sk-mine" not in err.value.message


# -- a managed process --------------------------------------------------------------------------------


def test_the_started_process_argv_environment_and_capabilities(
    tmp_path: Path,
    fake_vllm: Path,
    fake_model: Path,
    monkeypatch: pytest.MonkeyPatch,
    adapters: list[VllmAdapter],
) -> None:
    monkeypatch.setenv("WERK_VLLM_ARGS", "--dtype float32")
    monkeypatch.setenv("FAKE_VLLM_VERSION", "0.32.0+cpu")
    cfg = config(
        tmp_path,
        PersistenceDefaults(),
        executable=str(fake_vllm),
        max_model_len=512,
        max_num_seqs=3,
        startup_timeout=60,
    )
    adapter = create_adapter(cfg, model_manifest(fake_model, max_output_tokens=100))
    adapters.append(adapter)
    (spawn,) = records(tmp_path / "records", "spawn")
    argv = spawn["argv"]
    assert argv[0] == str(fake_model)
    assert argv[1:7] == ["--host", "127.0.0.1", "--port", argv[4], "--served-model-name", "tiny"]
    assert argv[7:] == ["--max-model-len", "512", "--max-num-seqs", "3", APC_ON, "--dtype", "float32"]
    assert spawn["hf_hub_offline"] == "1" and spawn["has_key"] is True
    assert not any(a.startswith("--api-key") for a in argv)  # the key travels in the environment

    caps = adapter.capabilities()
    assert caps[CapabilityId.MODEL_RESIDENCY].status is CapabilityStatus.SUPPORTED
    assert caps[CapabilityId.PREFIX_CACHE].status is CapabilityStatus.EXTERNALLY_MANAGED
    assert caps[CapabilityId.PREFIX_CACHE].operations == ("automatic_reuse",)
    for cap_id in (CapabilityId.TOKEN_COUNT, CapabilityId.ADMISSION, CapabilityId.CHAT_LIMITS):
        assert caps[cap_id].status is CapabilityStatus.SUPPORTED
    assert set(caps) == {
        CapabilityId.MODEL_RESIDENCY,
        CapabilityId.PREFIX_CACHE,
        CapabilityId.TOKEN_COUNT,
        CapabilityId.ADMISSION,
        CapabilityId.CHAT_LIMITS,
        CapabilityId.REASONING,
        CapabilityId.EMBEDDINGS,
        CapabilityId.RERANK,
    }
    for cap_id in (CapabilityId.EMBEDDINGS, CapabilityId.RERANK):
        assert caps[cap_id].status is CapabilityStatus.UNSUPPORTED and "chat instance" in caps[cap_id].detail
    assert adapter.embedding_limits() is None  # a chat instance

    limits = adapter.chat_limits(None)
    assert (
        limits.model,
        limits.context_tokens,
        limits.max_output_tokens,
        limits.max_concurrent_requests,
        limits.engine_queues,
    ) == ("tiny", 512, 100, 3, True)
    plan = adapter.plan()
    assert plan is not None and plan.endpoint is EndpointKind.LOCAL
    assert plan.arguments[:2] == ["serve", "<path>"] and str(fake_model) not in plan.arguments
    assert (plan.parallel_slots, plan.context_per_slot, plan.device) == (3, 512, "cpu")

    answer = body_of(adapter.relay("/v1/chat/completions", {"model": "alias", "messages": [], "werk": {}}))
    assert b'"usage"' in answer
    (request,) = records(tmp_path / "records", "request")
    assert request["body"]["model"] == "tiny" and "werk" not in request["body"] and request["auth"] is True

    count = adapter.count_tokens(ChatRequest.model_validate({"messages": [{"role": "user", "content": "a b c"}]}))
    assert count == 3 + 3 + 2
    (worker,) = adapter.workers()
    # the pid is the process group's (Werk's guard leads it; vllm serve runs under it)
    assert (worker.pid, worker.slots, worker.context_per_request_tokens) == (os.getpgid(spawn["pid"]), 3, 512)
    assert worker.kv_cache_usage == 0.25 and worker.requests_running == 0
    assert worker.prefix_cache_hit_rate is not None and worker.prefix_cache_hit_rate > 0


def test_one_process_per_launch_key_shared_and_reference_counted(
    tmp_path: Path, fake_vllm: Path, fake_model: Path, adapters: list[VllmAdapter]
) -> None:
    manifest = model_manifest(fake_model)
    first = create_adapter(config(tmp_path, executable=str(fake_vllm)), manifest)
    second = create_adapter(config(tmp_path, executable=str(fake_vllm)), manifest)
    other = create_adapter(config(tmp_path, executable=str(fake_vllm), max_model_len=256), manifest)
    adapters += [first, second, other]
    spawns = records(tmp_path / "records", "spawn")
    assert len(spawns) == 2  # first and second share; a different argv is another process
    shared = first.live()
    assert shared is not None and second.live() == shared and other.live() != shared
    assert first.identity().split("#")[1] == second.identity().split("#")[1]
    first.close()
    assert second.live() == shared and shared.pid is not None and not gone(shared.pid, timeout=0.2)
    second.close()
    assert gone(shared.pid, timeout=10)  # the last reference stopped it
    assert other.live() is not None


def test_a_dead_process_changes_identity_and_is_replaced_on_next_use(
    tmp_path: Path, fake_vllm: Path, fake_model: Path, adapters: list[VllmAdapter]
) -> None:
    adapter = create_adapter(config(tmp_path, executable=str(fake_vllm)), model_manifest(fake_model))
    adapters.append(adapter)
    before = adapter.identity()
    live = adapter.live()
    assert live is not None and live.pid is not None
    os.kill(live.pid, signal.SIGKILL)
    assert gone(live.pid, timeout=10)
    deadline = time.monotonic() + 10
    while adapter.live() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert adapter.identity() != before and adapter.identity().endswith("#none")
    caps = adapter.capabilities()
    assert caps[CapabilityId.MODEL_RESIDENCY].status is CapabilityStatus.UNAVAILABLE
    assert caps[CapabilityId.PREFIX_CACHE].status is CapabilityStatus.UNAVAILABLE
    assert adapter.plan() is None and adapter.workers() == []
    body_of(adapter.relay("/v1/completions", {"prompt": "a b", "max_tokens": 1}))  # restarts it
    after = adapter.live()
    assert after is not None and after.pid != live.pid and after.generation != live.generation
    assert adapter.identity() not in (before, f"{adapter.instance_id}#none")
    first, second = records(tmp_path / "records", "spawn")
    assert gone(first["pid"], timeout=5) and gone(first["engine_pid"], timeout=5)  # the old group went
    assert not gone(second["engine_pid"], timeout=0.1)


def test_werk_dying_by_sigkill_takes_the_whole_vllm_group_along(
    tmp_path: Path, fake_vllm: Path, fake_model: Path
) -> None:
    script = f"""
import sys, time
sys.path.insert(0, {str(Path(__file__).parent)!r})
from pathlib import Path
from vllm_helpers import model_manifest
from werk_host.plugin import HostConfig
from werk_vllm.adapter import create_adapter
home = Path({str(tmp_path / "home")!r}); home.mkdir()
cfg = HostConfig(home=home, backend_options={{"vllm": {{"executable": {str(fake_vllm)!r}}}}})
adapter = create_adapter(cfg, model_manifest(Path({str(fake_model)!r})))
print("READY", adapter.live().pid, flush=True)
time.sleep(600)
"""
    werk = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert werk.stdout is not None
        line = werk.stdout.readline()
        assert line.startswith("READY"), line
        (spawn,) = records(tmp_path / "records", "spawn")
        group = [int(line.split()[1]), spawn["pid"], spawn["engine_pid"]]
        assert not any(gone(pid, timeout=0.1) for pid in group)
        werk.kill()  # SIGKILL: no cleanup code runs in it
        werk.wait(timeout=10)
        assert all(gone(pid, timeout=10) for pid in group), "part of the vLLM process group outlived Werk"
    finally:
        if werk.poll() is None:
            werk.kill()
            werk.wait()


def test_a_failed_start_is_typed_and_its_log_tail_redacted(
    tmp_path: Path,
    fake_vllm: Path,
    fake_model: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("FAKE_VLLM_MODE", "crash")
    with caplog.at_level(logging.ERROR), pytest.raises(WerkError) as err:
        create_adapter(config(tmp_path, executable=str(fake_vllm)), model_manifest(fake_model))
    assert err.value.code is ErrorCode.UNAVAILABLE
    assert "exited with status 1" in err.value.message and "cannot load" not in err.value.message
    startup = err.value.__cause__
    assert isinstance(startup, VllmStartupError)
    assert "cannot load the model (api key [redacted])" in startup.log_tail
    assert "cannot load the model" in caplog.text and "api key [redacted]" in caplog.text
    run_dirs = list((tmp_path / "home" / "backends" / "vllm").glob("gen-*"))
    assert run_dirs == []  # its run directory went with it


# -- embedding and reranking instances ---------------------------------------------------------------------


def embed_work(*inputs: str | list[int]) -> EmbeddingWork:
    return EmbeddingWork(list(inputs), lambda: False)


def test_pooling_starts_the_pooling_runner_and_measures_the_instance(
    tmp_path: Path, fake_vllm: Path, fake_model: Path, adapters: list[VllmAdapter]
) -> None:
    cfg = config(tmp_path, executable=str(fake_vllm), pooling="cls", max_model_len=256, max_num_seqs=2)
    adapter = create_adapter(cfg, model_manifest(fake_model))
    adapters.append(adapter)
    (spawn,) = records(tmp_path / "records", "spawn")
    assert spawn["argv"][-6:] == [
        "--runner",
        "pooling",
        "--convert",
        "embed",
        "--pooler-config",
        '{"pooling_type":"CLS"}',
    ]
    limits = adapter.embedding_limits()
    assert limits is not None and not limits.rerank
    assert (limits.dimensions, limits.pooling, limits.normalized, limits.truncatable) == (8, "cls", True, False)
    assert (limits.max_input_tokens, limits.max_batch_inputs, limits.max_concurrent_requests) == (256, 64, 2)
    caps = adapter.capabilities()
    assert caps[CapabilityId.EMBEDDINGS].status is CapabilityStatus.SUPPORTED  # the probe answered
    assert caps[CapabilityId.RERANK].status is CapabilityStatus.UNSUPPORTED
    for cap_id in (CapabilityId.TOKEN_COUNT, CapabilityId.CHAT_LIMITS, CapabilityId.PREFIX_CACHE):
        assert caps[cap_id].status is CapabilityStatus.UNSUPPORTED and "embedding instance" in caps[cap_id].detail
    assert caps[CapabilityId.MODEL_RESIDENCY].status is CapabilityStatus.SUPPORTED

    ids = adapter.tokenize("a b c")
    assert ids is not None and len(ids) == 3
    words = adapter.embed(embed_work("a b c", "d e"))
    tokens = adapter.embed(embed_work(ids))
    assert words.prompt_tokens == 5 and tokens.vectors[0] == words.vectors[0]
    requests = [r for r in records(tmp_path / "records", "request") if r["path"] == "/v1/embeddings"]
    assert requests[-1]["body"]["input"] == [ids] and requests[-1]["auth"] is True
    assert all(r["body"]["model"] == "tiny" for r in requests)

    with pytest.raises(WerkError) as err:  # an id outside the vocabulary: vLLM's text stays in the log
        adapter.embed(embed_work([1, 9999]))
    assert err.value.code is ErrorCode.INVALID_REQUEST and "vocabulary" in err.value.message
    assert "fake vllm raw text" not in err.value.message
    for refused in (
        lambda: adapter.relay("/v1/chat/completions", {"messages": []}),
        lambda: adapter.count_tokens(ChatRequest.model_validate({"messages": [{"role": "user", "content": "a"}]})),
        lambda: adapter.rerank(RerankWork("q", ["d"], lambda: False)),
    ):
        with pytest.raises(WerkError) as err:
            refused()
        assert err.value.code is ErrorCode.INVALID_REQUEST and "embedding instance" in err.value.message
    assert not [r for r in records(tmp_path / "records", "request") if "completions" in r["path"]]  # never relayed


def test_a_model_vllm_pools_by_itself_is_an_embedding_instance_without_the_option(
    tmp_path: Path, fake_vllm: Path, fake_model: Path, monkeypatch: pytest.MonkeyPatch, adapters: list[VllmAdapter]
) -> None:
    monkeypatch.setenv("FAKE_VLLM_RUNNER", "pooling")  # as vLLM resolves a BertModel: no chat routes
    adapter = create_adapter(config(tmp_path, executable=str(fake_vllm)), model_manifest(fake_model))
    adapters.append(adapter)
    (spawn,) = records(tmp_path / "records", "spawn")
    assert "--runner" not in spawn["argv"]
    limits = adapter.embedding_limits()
    assert limits is not None and (limits.pooling, limits.dimensions, limits.max_concurrent_requests) == (
        "model",
        8,
        None,
    )
    assert adapter.capabilities()[CapabilityId.EMBEDDINGS].status is CapabilityStatus.SUPPORTED


def test_pooling_rank_is_a_reranking_instance(
    tmp_path: Path, fake_vllm: Path, fake_model: Path, adapters: list[VllmAdapter]
) -> None:
    adapter = create_adapter(config(tmp_path, executable=str(fake_vllm), pooling="rank"), model_manifest(fake_model))
    adapters.append(adapter)
    (spawn,) = records(tmp_path / "records", "spawn")
    assert spawn["argv"][-4:] == ["--runner", "pooling", "--convert", "classify"]
    limits = adapter.embedding_limits()
    assert limits is not None and limits.rerank and limits.pooling == "rank"
    result = adapter.rerank(RerankWork("a b", ["c d", "a b", "e"], lambda: False))
    assert len(result.scores) == 3 and max(result.scores) == result.scores[1]  # in the documents' order
    assert result.prompt_tokens == 3 * 2 + 2 + 2 + 1
    caps = adapter.capabilities()
    assert caps[CapabilityId.RERANK].status is CapabilityStatus.SUPPORTED
    assert caps[CapabilityId.EMBEDDINGS].status is CapabilityStatus.UNSUPPORTED
    with pytest.raises(WerkError) as err:
        adapter.embed(embed_work("x"))
    assert err.value.code is ErrorCode.INVALID_REQUEST and "reranking instance" in err.value.message


def test_a_vllm_without_the_pooling_runner_is_refused_before_spawning(
    tmp_path: Path, fake_vllm: Path, fake_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_VLLM_DROP", "--runner")
    with pytest.raises(WerkError) as err:
        create_adapter(config(tmp_path, executable=str(fake_vllm), pooling="mean"), model_manifest(fake_model))
    assert err.value.code is ErrorCode.UNAVAILABLE and "--runner" in err.value.message
    assert records(tmp_path / "records", "spawn") == []


def test_an_embedding_instance_whose_process_died_is_unavailable_then_answers_again(
    tmp_path: Path, fake_vllm: Path, fake_model: Path, adapters: list[VllmAdapter]
) -> None:
    adapter = create_adapter(config(tmp_path, executable=str(fake_vllm), pooling="mean"), model_manifest(fake_model))
    adapters.append(adapter)
    live = adapter.live()
    assert live is not None and live.pid is not None
    os.kill(live.pid, signal.SIGKILL)
    assert gone(live.pid, timeout=10)
    deadline = time.monotonic() + 10
    while adapter.live() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert adapter.capabilities()[CapabilityId.EMBEDDINGS].status is CapabilityStatus.UNAVAILABLE
    limits = adapter.embedding_limits()  # kept: the same argv and model
    assert limits is not None and limits.dimensions == 8
    assert len(adapter.embed(embed_work("x y")).vectors) == 1  # a new generation
    assert adapter.capabilities()[CapabilityId.EMBEDDINGS].status is CapabilityStatus.SUPPORTED


# -- remote endpoints -------------------------------------------------------------------------------------


@pytest.fixture
def remote_fake(tmp_path: Path) -> Iterator[str]:
    """A stand-in vLLM server with an API key, started like a remote machine would run it."""
    port = free_port()
    env = {**os.environ, "VLLM_API_KEY": REMOTE_KEY, "FAKE_VLLM_RECORD": str(tmp_path)}
    argv = [sys.executable, str(FAKE_VLLM), "serve", "m", "--port", str(port), "--served-model-name", "big"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not (tmp_path / "spawn.jsonl").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def remote(name: str = "big") -> ModelManifest:
    return ModelManifest(name, (), "vllm")


def test_a_remote_endpoint_with_its_key(
    tmp_path: Path,
    remote_fake: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    adapters: list[VllmAdapter],
) -> None:
    monkeypatch.setenv("BIG_KEY", REMOTE_KEY)
    with caplog.at_level(logging.DEBUG):
        adapter = create_adapter(
            config(tmp_path, endpoint=remote_fake, api_key_env="BIG_KEY", max_model_len=7), remote()
        )
        adapters.append(adapter)
        caps = adapter.capabilities()
        assert caps[CapabilityId.MODEL_RESIDENCY].status is CapabilityStatus.EXTERNALLY_MANAGED
        assert caps[CapabilityId.PREFIX_CACHE].status is CapabilityStatus.METADATA_ONLY
        assert caps[CapabilityId.TOKEN_COUNT].status is CapabilityStatus.SUPPORTED
        identity = adapter.identity()
        answer = body_of(adapter.relay("/v1/chat/completions", {"model": "x", "messages": [], "stream": True}))
        assert answer.count(b"data: ") == 3 and answer.endswith(b"data: [DONE]\n\n")
        plan = adapter.plan()
        assert plan is not None and plan.endpoint is EndpointKind.REMOTE and plan.arguments == []
        assert plan.context_per_slot == 2048 and plan.parallel_slots is None
        assert adapter.chat_limits("big").context_tokens == 2048
        assert adapter.identity() == identity  # stable for a remote endpoint
        assert adapter.workers()[0].pid is None
    assert REMOTE_KEY not in caplog.text and REMOTE_KEY not in repr(adapter.target.pool)
    assert REMOTE_KEY not in plan.model_dump_json()


def test_a_remote_embedding_endpoint_is_known_by_its_routes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, adapters: list[VllmAdapter]
) -> None:
    port = free_port()
    env = {**os.environ, "FAKE_VLLM_RECORD": str(tmp_path), "FAKE_VLLM_RUNNER": "pooling", "VLLM_API_KEY": REMOTE_KEY}
    argv = [sys.executable, str(FAKE_VLLM), "serve", "m", "--port", str(port), "--served-model-name", "big"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    monkeypatch.setenv("BIG_KEY", REMOTE_KEY)
    try:
        deadline = time.monotonic() + 20
        while not (tmp_path / "spawn.jsonl").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        adapter = create_adapter(config(tmp_path, endpoint=f"http://127.0.0.1:{port}", api_key_env="BIG_KEY"), remote())
        adapters.append(adapter)
        limits = adapter.embedding_limits()
        assert limits is not None and limits.dimensions == 8 and limits.max_input_tokens == 2048
        assert adapter.embed(embed_work("a b")).prompt_tokens == 2
        caps = adapter.capabilities()
        assert caps[CapabilityId.EMBEDDINGS].status is CapabilityStatus.SUPPORTED
        assert caps[CapabilityId.MODEL_RESIDENCY].status is CapabilityStatus.EXTERNALLY_MANAGED
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_remote_failures_are_typed(tmp_path: Path, remote_fake: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cases: list[tuple[dict[str, Any], ModelManifest, str]] = [
        ({"endpoint": remote_fake, "api_key_env": "UNSET_KEY_VAR"}, remote(), "UNSET_KEY_VAR"),
        ({"endpoint": remote_fake, "api_key_env": "WRONG_KEY"}, remote(), "refused"),
        ({"endpoint": remote_fake}, remote(), "refused"),
        ({"endpoint": remote_fake, "api_key_env": "BIG_KEY"}, remote("small"), "does not serve"),
        ({"endpoint": f"http://127.0.0.1:{free_port()}"}, remote(), "not answering"),
    ]
    monkeypatch.delenv("UNSET_KEY_VAR", raising=False)
    monkeypatch.setenv("WRONG_KEY", "sk-wrong")
    monkeypatch.setenv("BIG_KEY", REMOTE_KEY)
    for options, manifest, words in cases:
        with pytest.raises(WerkError) as err:
            create_adapter(config(tmp_path, **options), manifest)
        assert err.value.code is ErrorCode.UNAVAILABLE, options
        assert words in err.value.message, (options, err.value.message)
        assert REMOTE_KEY not in err.value.message and "sk-wrong" not in err.value.message


@pytest.mark.parametrize("health, reachable", [(200, True), (404, True), (405, True), (503, False)])
def test_remote_health_falls_back_to_models_only_where_health_is_not_exposed(
    tmp_path: Path, adapters: list[VllmAdapter], health: int, reachable: bool
) -> None:
    port = free_port()
    env = {**os.environ, "FAKE_VLLM_RECORD": str(tmp_path), "FAKE_VLLM_HEALTH": str(health)}
    argv = [sys.executable, str(FAKE_VLLM), "serve", "m", "--port", str(port), "--served-model-name", "big"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not (tmp_path / "spawn.jsonl").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        if reachable:
            adapters.append(create_adapter(config(tmp_path, endpoint=f"http://127.0.0.1:{port}"), remote()))
        else:
            with pytest.raises(WerkError) as err:  # vLLM answers /health 503 when its engine is dead
                create_adapter(config(tmp_path, endpoint=f"http://127.0.0.1:{port}"), remote())
            assert err.value.code is ErrorCode.UNAVAILABLE and "not answering" in err.value.message
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_a_remote_endpoint_that_goes_away_is_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, adapters: list[VllmAdapter]
) -> None:
    port = free_port()
    env = {**os.environ, "FAKE_VLLM_RECORD": str(tmp_path)}
    argv = [sys.executable, str(FAKE_VLLM), "serve", "m", "--port", str(port), "--served-model-name", "big"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                adapter = create_adapter(config(tmp_path, endpoint=f"http://127.0.0.1:{port}"), remote())
                break
            except WerkError:
                time.sleep(0.1)
        adapters.append(adapter)
        assert adapter.capabilities()[CapabilityId.MODEL_RESIDENCY].status is CapabilityStatus.EXTERNALLY_MANAGED
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    time.sleep(2.1)  # past the reachability cache
    caps = adapter.capabilities()
    assert caps[CapabilityId.MODEL_RESIDENCY].status is CapabilityStatus.UNAVAILABLE
    assert caps[CapabilityId.TOKEN_COUNT].status is CapabilityStatus.UNAVAILABLE
    with pytest.raises(WerkError) as err:
        adapter.relay("/v1/completions", {"prompt": "x"})
    assert err.value.code is ErrorCode.UNAVAILABLE and err.value.retryable
    assert adapter.plan() is None


# -- a deployment around bad instances ---------------------------------------------------------------------

PROFILE = """
[[instance]]
id = "good"
model = "tiny"
backend = "vllm"
preload = true
default = true

[[instance]]
id = "no-vllm"
model = "tiny"
backend = "vllm"
options = {{ executable = "{missing}" }}

[[instance]]
id = "old-vllm"
model = "tiny"
backend = "vllm"
options = {{ max_num_seqs = 4 }}

[[instance]]
id = "gone"
model = "tiny"
backend = "vllm"
endpoint = "http://127.0.0.1:{closed}"
"""


def test_bad_instances_fail_alone_and_the_host_keeps_serving(
    tmp_path: Path, fake_vllm: Path, fake_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_VLLM_DROP", "--max-num-seqs")  # the only instance that needs it fails
    home = tmp_path / "home"
    home.mkdir()
    ModelRegistry(home).add(model_manifest(fake_model))
    profile = tmp_path / "deployments.toml"
    profile.write_text(PROFILE.format(missing=tmp_path / "nowhere" / "vllm", closed=free_port()))
    plugins = PluginHost()
    plugins.register(plugin, "vllm")
    cfg = HostConfig(
        home=home, api_keys=("sk-test",), profile=profile, backend_options={"vllm": {"executable": str(fake_vllm)}}
    )
    with running(build_host(cfg, plugins=plugins)) as url:
        api = Api(url, "sk-test")
        body: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        for bad in ("no-vllm", "old-vllm", "gone"):
            status, doc = api.call("POST", "/v1/chat/completions", {**body, "model": bad})
            assert status == 503, doc
            assert bad in doc["error"]["message"] and "/" not in doc["error"]["message"]
            status, doc = api.call("POST", "/v1/chat/completions", {**body, "model": "good"})
            assert status == 200, doc
        status, doc = api.get("/werk/v1/deployments")
        states = {i["id"]: i["state"] for i in doc["data"]["inventory"]}
        assert states == {"good": "ready", "no-vllm": "failed", "old-vllm": "failed", "gone": "failed"}
    assert len(records(tmp_path / "records", "spawn")) == 1  # only the good one ever started
