"""The helpers of the plugin room every process backend shares: the process-group guard
(``guard="group"``), engine workers (:mod:`werk_host.plugin.workers`) and checkpoint
directories as manifests (:mod:`werk_host.plugin.checkpoints`). Real processes, real
directories."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from werk_host.plugin import ErrorCode, ModelFile, ModelManifest, WerkError, sha256_file
from werk_host.plugin.checkpoints import (
    architecture,
    checkpoint_dir,
    checkpoint_manifest,
    context_length,
    safetensors_metadata,
)
from werk_host.plugin.process import BackendStartupError, ManagedProcess, reap_stale_run_dirs
from werk_host.plugin.workers import WorkerRun, worker_env
from werk_host.testing.host import ModelRegistry, werk_main
from werk_host.testing.processes import gone

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")


def wait_for(path: Path, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)
    return path.read_text().strip()


def kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


# -- the process-group guard ------------------------------------------------------------------

#: A stand-in for ``werk serve``: starts an "engine" that starts a process of its own, then waits.
STAND_IN = """
import sys, time
from pathlib import Path
from werk_host.plugin.process import ManagedProcess
out = Path(sys.argv[1])
engine = ["sh", "-c", f"sleep 300 & echo $! > {out / 'worker.pid'}; wait"]
proc = ManagedProcess(engine, log_path=out / "engine.log", guard=sys.argv[2])
proc.start()
print(proc.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize(
    ("guard", "worker_dies"), [("group", True), pytest.param("pdeathsig", False, marks=linux_only)]
)
def test_werk_killed_by_sigkill_takes_the_engines_own_processes_along_under_the_group_guard(
    tmp_path: Path, guard: str, worker_dies: bool
) -> None:
    werk = subprocess.Popen([sys.executable, "-c", STAND_IN, str(tmp_path), guard], stdout=subprocess.PIPE, text=True)
    worker = 0
    try:
        assert werk.stdout is not None
        leader = int(werk.stdout.readline())
        worker = int(wait_for(tmp_path / "worker.pid"))
        assert not gone(leader, timeout=0.1) and not gone(worker, timeout=0.1)
        werk.kill()  # no cleanup code runs in the stand-in
        werk.wait(timeout=10)
        assert gone(leader, timeout=10)
        # the engine's own worker dies with Werk only under the group guard
        assert gone(worker, timeout=10 if worker_dies else 0.5) is worker_dies
    finally:
        if werk.poll() is None:
            werk.kill()
            werk.wait()
        if worker:
            kill_quietly(worker)


def test_the_group_guard_stops_with_the_group_and_exits_like_the_program(tmp_path: Path) -> None:
    engine = ["sh", "-c", f"sleep 300 & echo $! > {tmp_path / 'worker.pid'}; wait"]
    proc = ManagedProcess(engine, log_path=tmp_path / "engine.log", guard="group", stop_timeout=5)
    proc.start()
    worker = int(wait_for(tmp_path / "worker.pid"))
    try:
        assert proc.child is not None and proc.child.guard == "group"
        assert os.getpgid(worker) == proc.pid  # the guard leads the engine's process group
        proc.stop()
        assert gone(worker, timeout=5)
    finally:
        kill_quietly(worker)
    status = ManagedProcess(["sh", "-c", "exit 3"], log_path=tmp_path / "exit.log", guard="group").start()
    deadline = time.monotonic() + 10
    while status.returncode is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert status.returncode == 3
    status.stop()


# -- engine workers ------------------------------------------------------------------------------

KEY_ENV = "ROOM_TEST_WORKER_KEY"
#: An engine worker: prints what it was given (its key included: the log must not show it) and
#: answers ``GET /health`` on the port of its argv.
WORKER = textwrap.dedent(
    f"""
    import http.server, os, sys
    print("key", os.environ.get({KEY_ENV!r}), "offline", os.environ.get("HF_HUB_OFFLINE"), flush=True)
    print("cwd", os.getcwd(), flush=True)
    if sys.argv[2] == "die":
        sys.exit(7)
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
    """
)


def worker_run(work_dir: Path, error_type: type[BackendStartupError] = BackendStartupError) -> WorkerRun:
    return WorkerRun("test worker", work_dir, prefix="w-", key_env=KEY_ENV, error_type=error_type, stop_timeout=5)


def test_a_worker_run_starts_in_its_own_locked_run_directory_with_its_key_and_stops_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "inherited-key-must-not-reach-the-worker")
    work = tmp_path / "backends" / "test" / "workers"
    run = worker_run(work)
    seen: list[Path] = []

    def argv(run_dir: Path) -> list[str]:
        seen.append(run_dir)
        (run_dir / "prepared").write_text("x")
        return [sys.executable, "-c", WORKER, str(run.port), "serve"]

    run_dir = run.start(argv, log_name="worker.log", startup_timeout=30)
    try:
        assert seen == [run_dir] and run_dir == work / f"w-{run.generation}"
        assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
        assert {p.name for p in run_dir.iterdir()} >= {"worker.log", "child.json", "prepared"}
        assert run.alive() and run.pid is not None and run.key is not None
        assert all(run.key not in arg for arg in run.argv)  # the key travels in the environment only
        log = (run_dir / "worker.log").read_text()
        assert f"key {run.key} offline 1" in log and f"cwd {run_dir}" in log
        assert run.key not in run.log_tail() and "[redacted]" in run.log_tail()
        assert reap_stale_run_dirs(work, prefix="w-") == []  # a live owner holds it
        assert run_dir.is_dir()
    finally:
        run.stop()
    assert run.pid is not None and gone(run.pid, timeout=5)
    assert not run_dir.exists() and not run.alive()
    run.stop()  # idempotent
    with pytest.raises(RuntimeError):
        run.start([sys.executable, "-c", WORKER, str(run.port), "serve"], log_name="again.log", startup_timeout=5)


class RoomWorkerStartupError(BackendStartupError):
    pass


def test_a_worker_that_dies_during_startup_is_the_callers_error_and_leaves_nothing(tmp_path: Path) -> None:
    work = tmp_path / "workers"
    stale = work / "w-stale"
    stale.mkdir(parents=True)  # left by a crashed owner: nobody holds its lock
    other = work / "x-other"
    other.mkdir()
    run = worker_run(work, RoomWorkerStartupError)
    with pytest.raises(RoomWorkerStartupError) as caught:
        run.start([sys.executable, "-c", WORKER, str(run.port), "die"], log_name="worker.log", startup_timeout=30)
    assert caught.value.returncode == 7
    assert run.key is not None and run.key not in caught.value.log_tail and "[redacted]" in caught.value.log_tail
    assert sorted(p.name for p in work.iterdir()) == ["x-other"]  # the stale one swept, its own removed


def test_a_failing_argv_leaves_no_run_directory(tmp_path: Path) -> None:
    run = worker_run(tmp_path / "workers")

    def argv(run_dir: Path) -> list[str]:
        raise OSError("cannot prepare the model directory")

    with pytest.raises(OSError, match="cannot prepare"):
        run.start(argv, log_name="worker.log", startup_timeout=5)
    assert list((tmp_path / "workers").iterdir()) == []


def test_the_worker_environment_is_offline_and_holds_only_its_own_key() -> None:
    env = worker_env({"PATH": "/bin", KEY_ENV: "old", "HF_HUB_OFFLINE": "0"}, KEY_ENV, "new")
    assert env == {"PATH": "/bin", KEY_ENV: "new", "HF_HUB_OFFLINE": "1"}
    assert worker_env({KEY_ENV: "kept"}) == {KEY_ENV: "kept", "HF_HUB_OFFLINE": "1"}


# -- checkpoint directories ------------------------------------------------------------------


def safetensors(path: Path, metadata: dict[str, str] | None) -> None:
    """A minimal safetensors file: one float32 tensor of two values and ``metadata``."""
    header: dict[str, object] = {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    if metadata is not None:
        header["__metadata__"] = metadata
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + struct.pack("<2f", 1.0, 2.0))


def checkpoint(directory: Path, config: dict[str, object], metadata: dict[str, str] | None = None) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config))
    safetensors(directory / "model.safetensors", metadata)
    (directory / "tokenizer.json").write_text('{"model": {}}')
    (directory / ".cache").mkdir()
    (directory / ".hidden").write_text("not a model file")
    (directory / "nested").mkdir()
    (directory / "nested" / "extra.bin").write_bytes(b"\0")
    return directory


def test_a_checkpoint_directory_becomes_a_manifest_of_its_files_sizes_and_architecture(tmp_path: Path) -> None:
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "max_position_embeddings": 2048}
    directory = checkpoint(tmp_path / "Tiny Llama!", config)
    manifest = checkpoint_manifest(directory)
    assert manifest.name == "Tiny-Llama-" and manifest.backend is None
    assert manifest.params == {"architecture": "LlamaForCausalLM"}
    names = ["config.json", "model.safetensors", "tokenizer.json"]
    assert manifest.files == tuple(
        ModelFile(str(directory / n), (directory / n).stat().st_size, sha256_file(directory / n)) for n in names
    )
    assert checkpoint_dir(manifest) == directory.resolve()
    pinned = checkpoint_manifest(directory, "tiny", backend="vllm", params={"max_output_tokens": 64})
    assert (pinned.name, pinned.backend) == ("tiny", "vllm")
    assert pinned.params == {"architecture": "LlamaForCausalLM", "max_output_tokens": 64}
    assert (architecture(directory), context_length(directory)) == ("LlamaForCausalLM", 2048)


def test_the_manifest_lists_exactly_the_files_werk_models_add_registers(tmp_path: Path) -> None:
    directory = checkpoint(tmp_path / "moe", {"model_type": "qwen3_moe"})
    home = tmp_path / "home"
    assert werk_main(["models", "add", "moe", str(directory), "--home", str(home)]) == 0
    registered = ModelRegistry(home).get("moe")
    assert registered is not None
    manifest = checkpoint_manifest(directory)
    assert manifest.files == registered.files
    assert manifest.params == {"architecture": "qwen3_moe"}  # model_type where no architectures are named


def test_a_model_file_is_a_one_file_manifest_and_other_paths_are_refused(tmp_path: Path) -> None:
    model = tmp_path / "tiny.q4.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 60)
    manifest = checkpoint_manifest(model)
    assert manifest.name == "tiny.q4" and manifest.files == (ModelFile(str(model), 64, sha256_file(model)),)
    assert checkpoint_dir(manifest) is None and manifest.params == {}
    with pytest.raises(WerkError) as missing:
        checkpoint_manifest(tmp_path / "nowhere")
    assert missing.value.code is ErrorCode.NOT_FOUND
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "config.json").write_text("{}")
    with pytest.raises(WerkError) as refused:
        checkpoint_manifest(tmp_path / "plain")  # no weights beside config.json
    assert refused.value.code is ErrorCode.INVALID_REQUEST and "config.json" in refused.value.message


def test_checkpoint_detection_reads_only_what_the_directory_says(tmp_path: Path) -> None:
    mlx = checkpoint(tmp_path / "mlx", {"model_type": "qwen3_moe"}, {"format": "mlx"})
    assert safetensors_metadata(mlx) == {"format": "mlx"}
    plain = checkpoint(tmp_path / "hf", {"model_type": "llama"}, None)
    assert safetensors_metadata(plain) is None
    (plain / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{}")  # a header beyond the bound
    assert safetensors_metadata(plain) is None
    (plain / "config.json").write_text("[1, 2]")
    assert architecture(plain) is None and context_length(plain) is None
    assert safetensors_metadata(tmp_path) is None  # no weights at all
    split = ModelManifest.from_paths("split", [mlx / "config.json", plain / "model.safetensors"])
    assert checkpoint_dir(split) is None  # files of two directories are not one checkpoint
    assert checkpoint_dir(ModelManifest.from_paths("cfg", [mlx / "config.json"])) is None
