from __future__ import annotations

import gc
import os
import stat
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
from llamacpp_fakes import FAKE_HELP, calls, write_fake_server
from werk_llamacpp.binary import UnadvertisedFlagError
from werk_llamacpp.process import (
    LlamaServerProcess,
    LlamaServerStartupError,
    effective_args_hash,
    kv_layout_args_hash,
    last_flag_value,
)

from werk_host.plugin.process import BackendStartupError, live_children
from werk_host.testing.processes import gone as _gone

# -- pure helpers ---------------------------------------------------------------------


def test_last_flag_value() -> None:
    argv = ["-np", "1", "--port", "9", "--parallel=3", "-c", "100"]
    assert last_flag_value(argv, ("-np", "--parallel")) == "3"
    assert last_flag_value(argv + ["-np", "5"], ("-np", "--parallel")) == "5"
    assert last_flag_value(argv, ("--missing",)) is None
    assert last_flag_value(["-np"], ("-np",)) is None


def test_args_hash_ignores_port_and_slot_path_only() -> None:
    a = ["--port", "1", "-np", "2", "--slot-save-path", "/a"]
    b = ["--port", "2", "-np", "2", "--slot-save-path", "/b"]
    c = ["--port", "2", "-np", "3", "--slot-save-path", "/b"]
    assert effective_args_hash(a) == effective_args_hash(b) != effective_args_hash(c)
    assert effective_args_hash(["--port=1"]) == effective_args_hash(["--port=2"])


def test_kv_args_hash_ignores_only_flags_that_cannot_change_kv_state() -> None:
    base = ["--host", "127.0.0.1", "--port", "1", "-m", "/a/m.gguf", "-np", "2", "-c", "4096"]
    same = [
        *["--host", "::1", "--port=2", "--model", "/b/m.gguf", "-np", "2", "-c", "4096"],
        *["--slot-save-path", "/s", "-t", "3", "--threads-batch", "2", "--alias", "x", "--metrics", "--no-warmup"],
    ]
    assert kv_layout_args_hash(base) == kv_layout_args_hash(same)
    for changed in (["-c", "8192"], ["-np", "3"], ["-ctk", "q8_0"], ["--kv-unified"], ["-ngl", "1"]):
        assert kv_layout_args_hash(base + changed) != kv_layout_args_hash(base), changed
    assert kv_layout_args_hash(["-c", "1"]) != kv_layout_args_hash(["-c", "2"])


def test_health_timeout_kills_child_and_reports_log(tmp_path: Path) -> None:
    fake = write_fake_server(tmp_path / "bin")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    proc = LlamaServerProcess(model, binary=fake, env_args="", startup_timeout=1.0, work_dir=tmp_path / "w")
    with pytest.raises(LlamaServerStartupError) as err:
        proc.start()
    assert isinstance(err.value, BackendStartupError)  # the host's typed startup error
    assert "did not become healthy within 1s" in str(err.value)
    assert "--- llama-server log (tail) ---" in str(err.value) and err.value.returncode is None
    assert "fake llama-server starting" in err.value.log_tail
    assert proc.pid is not None and _gone(proc.pid)
    assert not proc.alive()
    assert list((tmp_path / "w").iterdir()) == []  # run directory removed


def test_generated_flags_are_verified_before_spawn(tmp_path: Path) -> None:
    fake = write_fake_server(tmp_path / "bin")
    proc = LlamaServerProcess(tmp_path / "m.gguf", binary=fake, env_args="", threads=2, startup_timeout=0.5)
    # the fake help advertises -t; -np etc. — all generated flags pass verification
    with pytest.raises(LlamaServerStartupError):
        proc.start()
    assert "-t" in proc.argv and "--no-warmup" in proc.argv


def test_unadvertised_generated_flag_is_refused(tmp_path: Path) -> None:
    old_help = "\n".join(
        line for line in FAKE_HELP.splitlines() if "slot-save-path" not in line and "warmup" not in line
    )
    fake = write_fake_server(tmp_path / "bin", help_text=old_help)
    proc = LlamaServerProcess(tmp_path / "m.gguf", binary=fake, env_args="")
    with pytest.raises(UnadvertisedFlagError) as err:
        proc.start()
    assert err.value.flags == ("--slot-save-path",)
    assert proc.pid is None and calls(fake) == ["--help", "--version"]  # never spawned
    # a runtime without warmup controls keeps its default: no warmup flag is generated
    plain = LlamaServerProcess(tmp_path / "m.gguf", binary=fake, env_args="", slot_save=False, startup_timeout=0.3)
    with pytest.raises(LlamaServerStartupError):
        plain.start()
    assert "--no-warmup" not in plain.argv and "--warmup" not in plain.argv


# -- real llama-server -----------------------------------------------------------------

pytestmark_real = pytest.mark.llamaserver


@pytestmark_real
def test_start_stop_no_orphan(llama_server_path: Path, tiny_model: Path, tmp_path: Path) -> None:
    proc = LlamaServerProcess(
        tiny_model, binary=llama_server_path, parallel=2, ctx=1024, env_args="", work_dir=tmp_path / "werk"
    )
    proc.start()
    try:
        assert proc.alive() and proc.managed in live_children()  # covered by the host's signal cleanup
        pid = proc.pid
        assert pid is not None
        argv = proc.argv
        assert argv[0] == str(llama_server_path.resolve())
        assert argv[argv.index("--host") + 1] == "127.0.0.1"
        assert argv[argv.index("-np") + 1] == "2" and argv[argv.index("-c") + 1] == "1024"
        assert "--no-warmup" in argv and "--warmup" not in argv
        assert proc.slot_dir is not None and proc.effective_slot_save_path() == proc.slot_dir
        assert stat.S_IMODE(proc.slot_dir.stat().st_mode) == 0o700
        assert proc.run_dir is not None and stat.S_IMODE(proc.run_dir.stat().st_mode) == 0o700
        assert proc.effective_parallel() == 2
        fp = proc.fingerprints()
        assert set(fp) == {"executable_sha256", "help_sha256", "args_sha256", "kv_args_sha256", "generation"}
        assert fp["kv_args_sha256"] == kv_layout_args_hash(argv[1:])
        assert len(fp["generation"]) == 32
        assert proc.client is not None and proc.client.health()
        assert proc.client.props()["total_slots"] == 2
        run_dir = proc.run_dir
    finally:
        rc = proc.stop()
    assert rc is not None
    assert _gone(pid)
    assert not proc.alive() and proc.managed not in live_children()
    assert not run_dir.exists()
    assert proc.stop() == rc  # idempotent


@pytestmark_real
def test_generation_and_args_hash(llama_server_path: Path, tiny_model: Path) -> None:
    with (
        LlamaServerProcess(tiny_model, binary=llama_server_path, ctx=512, env_args="") as a,
        LlamaServerProcess(tiny_model, binary=llama_server_path, ctx=512, env_args="") as b,
    ):
        assert a.generation != b.generation
        assert a.port != b.port
        assert a.args_hash == b.args_hash  # same effective arguments
        assert a.fingerprints()["executable_sha256"] == b.fingerprints()["executable_sha256"]
    with LlamaServerProcess(tiny_model, binary=llama_server_path, ctx=512, warmup_tokens=4, env_args="") as c:
        assert "--warmup" in c.argv and "--no-warmup" not in c.argv
        assert c.args_hash != a.args_hash


@pytestmark_real
def test_werk_llama_args_are_trailing_overrides(
    llama_server_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WERK_LLAMA_ARGS", "--parallel 3 -c 768")
    with LlamaServerProcess(tiny_model, binary=llama_server_path, parallel=1, ctx=512) as proc:
        assert proc.argv[-4:] == ["--parallel", "3", "-c", "768"]
        assert proc.effective_parallel() == 3
        assert proc.client is not None
        props = proc.client.props()
        assert props["total_slots"] == 3 == proc.total_slots  # the server really runs what the final argv says
        assert len(proc.client.slots()) == 3


@pytestmark_real
def test_garbage_gguf_surfaces_native_log(llama_server_path: Path, tmp_path: Path) -> None:
    bad = tmp_path / "garbage.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(4096))
    proc = LlamaServerProcess(bad, binary=llama_server_path, env_args="", startup_timeout=60)
    with pytest.raises(LlamaServerStartupError) as err:
        proc.start()
    assert err.value.returncode not in (None, 0)
    assert "gguf" in err.value.log_tail.lower() or "model" in err.value.log_tail.lower()
    assert len(err.value.log_tail.splitlines()) <= 40
    assert proc.pid is not None and _gone(proc.pid)


@pytestmark_real
def test_unknown_architecture_surfaces_native_log(llama_server_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "alien.gguf"
    w = gguf.GGUFWriter(str(path), arch="werkalien")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    proc = LlamaServerProcess(path, binary=llama_server_path, env_args="", startup_timeout=60)
    t0 = time.monotonic()
    with pytest.raises(LlamaServerStartupError) as err:
        proc.start()
    assert time.monotonic() - t0 < 30
    assert "unknown model architecture: 'werkalien'" in err.value.log_tail
    assert "unknown model architecture" in str(err.value)


@pytestmark_real
def test_garbage_collected_process_is_reaped(llama_server_path: Path, tiny_model: Path) -> None:
    proc = LlamaServerProcess(tiny_model, binary=llama_server_path, ctx=512, env_args="").start()
    pid = proc.pid
    assert pid is not None
    del proc
    gc.collect()
    assert _gone(pid)
