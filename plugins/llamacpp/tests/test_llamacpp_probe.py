from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from werk_llamacpp.probe import run_probe
from werk_llamacpp.process import LlamaServerProcess

pytestmark = pytest.mark.llamaserver


def test_probe_passes(server: LlamaServerProcess) -> None:
    result = run_probe(server)
    assert result.passed, result.reason
    ev = result.evidence
    assert all(ev["checks"].values())
    assert ev["id_slot"] == 1
    n = ev["prefill"]["tokens_evaluated"]
    assert ev["save"]["n_saved"] == ev["restore"]["n_restored"] == ev["erase"]["n_erased"]
    assert ev["save"]["n_written"] == ev["restore"]["n_read"] == ev["snapshot_bytes"]
    assert ev["replay"]["cache_n"] == n - 1 and ev["replay"]["prompt_n"] == 1
    assert server.slot_dir is not None and list(server.slot_dir.iterdir()) == []  # snapshot removed
    # a second probe on the same generation passes again (fresh nonce, fresh slot)
    again = run_probe(server, id_slot=0)
    assert again.passed, again.reason


def test_probe_fails_without_slot_save_path(llama_server_path: Path, tiny_model: Path) -> None:
    with LlamaServerProcess(tiny_model, binary=llama_server_path, ctx=1024, env_args="", slot_save=False) as proc:
        result = run_probe(proc)
    assert not result.passed
    assert result.reason is not None and "private_slot_save_path" in result.reason


def test_probe_fails_when_override_moves_snapshot_dir(
    llama_server_path: Path, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WERK_LLAMA_ARGS", f"--slot-save-path {tmp_path}")
    with LlamaServerProcess(tiny_model, binary=llama_server_path, ctx=1024) as proc:
        result = run_probe(proc)
    assert not result.passed
    assert result.evidence["checks"]["private_slot_save_path"] is False


def test_probe_fails_when_override_removes_probe_slot(
    llama_server_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WERK_LLAMA_ARGS", "-np 1")
    with LlamaServerProcess(tiny_model, binary=llama_server_path, parallel=2, ctx=1024) as proc:
        result = run_probe(proc, id_slot=1)
    assert not result.passed
    assert result.evidence["checks"]["slot_in_range"] is False


def test_probe_fails_when_saving_is_broken(llama_server_path: Path, tiny_model: Path) -> None:
    with LlamaServerProcess(tiny_model, binary=llama_server_path, ctx=1024, env_args="") as proc:
        assert proc.slot_dir is not None
        # the private directory is replaced by a regular file: the server cannot write snapshots
        shutil.rmtree(proc.slot_dir)
        proc.slot_dir.write_bytes(b"")
        result = run_probe(proc)
    assert not result.passed
    assert result.reason is not None and "llama-server error" in result.reason
    assert "save" not in result.evidence or result.evidence["checks"].get("snapshot_size") is not True


def test_probe_fails_on_dead_process(llama_server_path: Path, tiny_model: Path) -> None:
    proc = LlamaServerProcess(tiny_model, binary=llama_server_path, ctx=512, env_args="").start()
    proc.stop()
    result = run_probe(proc)
    assert not result.passed and result.evidence["checks"]["process_alive"] is False
