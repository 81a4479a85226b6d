from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from werk_llamacpp.native import NativePersistenceOff
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


def test_the_executable_is_checked_again_after_readiness(server: LlamaServerProcess) -> None:
    assert server.executable_check is not None
    assert server.persistence_off() is None  # unchanged since its inspection: saves and restores run


def test_an_executable_replaced_while_its_child_starts_turns_native_persistence_off(
    llama_server_path: Path, tiny_model: Path, tmp_path: Path
) -> None:
    """The file is replaced after its inspection, before the child is ready (a rebuild racing the
    start): the check after readiness finds it changed. Chats go on; every slot save and restore
    is refused before it is sent, so the probe fails with that reason."""
    binary = tmp_path / "llama-server"
    shutil.copy2(llama_server_path, binary)
    proc = LlamaServerProcess(tiny_model, binary=binary, ctx=1024, env_args="")

    def replace_once_spawning() -> None:
        deadline = time.monotonic() + 60
        while proc.managed is None and time.monotonic() < deadline:
            time.sleep(0.001)
        rebuilt = tmp_path / "llama-server.new"
        shutil.copy2(llama_server_path, rebuilt)
        with rebuilt.open("ab") as out:
            out.write(b"\0")  # another file (size, hash) that still runs
        os.replace(rebuilt, binary)

    replacer = threading.Thread(target=replace_once_spawning)
    replacer.start()
    with proc:
        replacer.join()
        reason = proc.persistence_off()
        assert reason is not None and "executable changed" in reason
        client = proc.new_client(n_slots=1)
        with pytest.raises(NativePersistenceOff, match="executable changed"):
            client.slot_save(0, "refused.bin")
        with pytest.raises(NativePersistenceOff):
            client.slot_restore(0, "refused.bin")
        assert client.completion("Hello", n_predict=2, id_slot=0).tokens_evaluated  # chats go on
        assert client.slot_erase(0).id_slot == 0  # erasing is isolation, not persistence
        assert proc.slot_dir is not None and list(proc.slot_dir.iterdir()) == []
        result = run_probe(proc, id_slot=0)
        client.close()
    assert not result.passed and result.reason is not None and "executable changed" in result.reason
