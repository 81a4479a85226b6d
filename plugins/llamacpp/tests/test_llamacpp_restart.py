"""Named states across restarts, against a real llama-server behind a real Werk host.

A state written by one llama-server generation is restored by a later one only when that
generation's functional probe passed, the compatibility key is exactly equal, the payload
verifies and llama-server acknowledges the restore exactly (docs/states.md). Restore and decode
equality run on the real SmolLM2 model; the mismatch and corruption cases use the generated
tiny model (the compatibility key and the store decide them, not the weights).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import werk_llamacpp.core as core_module
from werk_llamacpp import snapshot
from werk_llamacpp.adapter import LlamaCppAdapter
from werk_llamacpp.testing.testmodel import generate_model

from werk_host.plugin import HostConfig, ModelManifest, checksum_text
from werk_host.testing.api import Api
from werk_host.testing.host import Host, ModelRegistry, build_host
from werk_host.testing.hosts import running

pytestmark = pytest.mark.llamaserver
KEY = "sk-werk-restart-test-123456"
MODEL = "doc"
DOCUMENT = (
    "Werk keeps the prefix of a long document as a named state on disk, so that a restarted "
    "server answers the next question without reading the whole document again. "
) * 3
MESSAGES = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": f"{DOCUMENT}\nIn one sentence: what does Werk keep on disk?"},
]
GREEDY = {"max_tokens": 12, "temperature": 0, "seed": 1}


@dataclass
class Session:
    api: Api
    host: Host | None = None  # None: a `werk serve` subprocess

    @property
    def adapter(self) -> LlamaCppAdapter:
        assert self.host is not None
        adapter = self.host.fleet.adapter
        assert isinstance(adapter, LlamaCppAdapter)
        return adapter

    def generation(self) -> str:
        proc = self.adapter.current()
        assert proc is not None
        return proc.generation

    def prefill(self, policy: dict[str, str] | None = None, *, chat: bool = False) -> tuple[int, dict[str, Any]]:
        source = {"type": "messages", "messages": MESSAGES} if chat else {"type": "text", "text": DOCUMENT}
        body: dict[str, Any] = {"model_id": MODEL, "input": source, "allow_experimental": True}
        if policy is not None:
            body["policy"] = policy
        return self.api.post("/werk/v1/prefill", body)

    def decode(self, handoff: str, **extra: Any) -> tuple[int, dict[str, Any]]:
        return self.api.post(
            "/werk/v1/decode", {"handoff": handoff, "allow_experimental": True, "max_tokens": 4, **extra}
        )

    def capability(self, cap_id: str) -> dict[str, Any]:
        status, body = self.api.get("/werk/v1/capabilities")
        assert status == 200, body
        return next(c for c in body["data"] if c["id"] == cap_id)

    def states(self) -> list[dict[str, Any]]:
        states: list[dict[str, Any]] = ok(self.api.get("/werk/v1/states"))["states"]
        return states


def ok(result: tuple[int, dict[str, Any]]) -> dict[str, Any]:
    status, body = result
    assert status == 200, body
    data: dict[str, Any] = body["data"]
    return data


def install(home: Path, model: Path) -> None:
    ModelRegistry(home).add(ModelManifest.from_paths(MODEL, [model], backend="llama.cpp"))


@contextmanager
def hosted(home: Path, binary: Path, *, ctx: int = 4096) -> Iterator[Session]:
    """A Werk host as ``werk serve`` builds it (a fresh llama-server generation), served."""
    config = HostConfig(
        home=home,
        api_keys=(KEY,),
        model=MODEL,
        backend_options={"llamacpp": {"llama_server": str(binary), "parallel": 2, "ctx": ctx}},
    )
    host = build_host(config)
    with running(host) as base:
        yield Session(Api(base, KEY), host)


def payload_of(home: Path, state_id: str) -> Path:
    (path,) = home.glob(f"runtime-state/v1/p_*/{state_id}/payload.bin")
    return path


def quarantined(home: Path) -> list[str]:
    qdir = home / "runtime-state" / "v1" / ".quarantine"
    return sorted(n.rsplit("-", 1)[1] for n in os.listdir(qdir)) if qdir.exists() else []


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def own_tiny(tmp_path: Path, tiny_model: Path) -> Path:
    """A private copy of the tiny model (some tests replace it in place)."""
    return Path(shutil.copyfile(tiny_model, tmp_path / "tiny.gguf"))


# -- restore after a restart (real model) ----------------------------------------------------
def test_a_state_written_before_a_restart_is_restored_and_decodes_identically(
    home: Path, llama_server_path: Path, smollm2_gguf: Path
) -> None:
    install(home, smollm2_gguf)
    with hosted(home, llama_server_path) as first:
        written = ok(first.prefill(chat=True))
        assert written["reused"] is False and written["tier"] == "disk"
        original = ok(first.decode(written["handoff"], **GREEDY))
        pending = ok(first.prefill(chat=True))  # reused; its handoff is never consumed
        assert pending["reused"] is True
        old_generation = first.generation()
    assert original["text"].strip() and original["completion_tokens"] > 0

    with hosted(home, llama_server_path) as second:
        assert second.generation() != old_generation
        before = second.capability("runtime.state.restore.cross_restart")
        assert before["status"] == "unavailable" and "has not run" in before["detail"]
        (listed,) = second.states()
        assert listed["id"] == written["state_id"] and listed["reusable"] is True
        status, body = second.decode(pending["handoff"], **GREEDY)
        assert (status, body["error"]["code"]) == (410, "expired_handoff")  # handoffs die with the process

        again = ok(second.prefill({"reuse": "required"}, chat=True))
        assert again["reused"] is True and again["state_id"] == written["state_id"]
        restored = ok(second.decode(again["handoff"], **GREEDY))
        assert restored["text"] == original["text"]
        evidence = second.adapter.last_decode
        assert evidence["source"] == "stored"  # restored from the verified payload ...
        assert evidence["prompt_n"] == 1 and evidence["cache_n"] == evidence["prompt_tokens"] - 1  # ... not recomputed
        probe = second.adapter.probe_result()
        assert probe is not None and probe.passed  # this generation's probe ran before the restore
        after = second.capability("runtime.state.restore.cross_restart")
        assert after["status"] == "experimental" and "probe passed" in after["detail"]


def test_werk_serve_restart_restores_the_named_state(home: Path, llama_server_path: Path, smollm2_gguf: Path) -> None:
    install(home, smollm2_gguf)
    env = {**os.environ, "WERK_HOME": str(home), "WERK_API_KEYS": KEY, "WERK_LLAMA_SERVER": str(llama_server_path)}

    @contextmanager
    def werk_serve() -> Iterator[Session]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "werk_host", "serve", "--port", "0", "--model", MODEL],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            text=True,
        )
        try:
            assert proc.stdout is not None
            port = json.loads(proc.stdout.readline())["port"]
            yield Session(Api(f"http://127.0.0.1:{port}", KEY))
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    with werk_serve() as first:
        written = ok(first.prefill(chat=True))
        original = ok(first.decode(written["handoff"], **GREEDY))
    with werk_serve() as second:
        again = ok(second.prefill({"reuse": "required"}, chat=True))
        assert again["reused"] is True and again["state_id"] == written["state_id"]
        assert ok(second.decode(again["handoff"], **GREEDY))["text"] == original["text"]
        assert second.capability("runtime.state.restore.cross_restart")["status"] == "experimental"


# -- what blocks a restore (generated model) --------------------------------------------------
@pytest.mark.parametrize("change", ["kv_args", "model_file", "model_in_place", "executable", "cache_layout"])
def test_each_compatibility_dimension_blocks_reuse_with_its_mismatch_field(
    change: str,
    home: Path,
    tmp_path: Path,
    llama_server_path: Path,
    own_tiny: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    install(home, own_tiny)
    with hosted(home, llama_server_path) as first:
        written = ok(first.prefill())
        ok(first.decode(written["handoff"]))
    binary, ctx = llama_server_path, 4096
    if change == "kv_args":
        ctx, expected = 6144, ["kv_args_sha256"]
    elif change == "model_file":
        install(home, generate_model(tmp_path / "other.gguf", seed=1))
        expected = ["model_files", "model_identity"]
    elif change == "model_in_place":
        size = own_tiny.stat().st_size
        generate_model(own_tiny, seed=1)  # other weights, same path, same size: the manifest is unchanged
        assert own_tiny.stat().st_size == size
        expected = ["model_files"]
    elif change == "executable":
        binary = Path(shutil.copy2(llama_server_path, tmp_path / "llama-server"))
        with open(binary, "ab") as patch:
            patch.write(b"\0werk test patch")  # still runs, same --help, another SHA-256
        expected = ["executable_sha256"]
    else:
        monkeypatch.setattr(core_module, "CACHE_LAYOUT", "werk-llamacpp-slot-v0")
        expected = ["cache_layout"]

    with hosted(home, binary, ctx=ctx) as second:
        (listed,) = second.states()
        assert listed["id"] == written["state_id"] and listed["reusable"] is False
        status, body = second.prefill({"reuse": "required"})
        assert (status, body["error"]["code"]) == (409, "incompatible_state")
        assert body["error"]["details"]["mismatch_fields"] == expected
        assert second.adapter.probe_result() is None  # never silently recomputed under required
        assert [s["id"] for s in second.states()] == [written["state_id"]]
        fresh = ok(second.prefill({"reuse": "prefer"}))  # prefer recomputes instead
        assert fresh["reused"] is False and fresh["state_id"] != written["state_id"]


def test_a_generation_whose_probe_fails_restores_nothing(
    home: Path, tmp_path: Path, llama_server_path: Path, own_tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(home, own_tiny)
    with hosted(home, llama_server_path) as first:
        written = ok(first.prefill())
        ok(first.decode(written["handoff"]))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    # A neutral flag for the compatibility key, but it escapes the private snapshot directory: the probe fails.
    monkeypatch.setenv("WERK_LLAMA_ARGS", f"--slot-save-path {elsewhere}")
    with hosted(home, llama_server_path) as second:
        again = ok(second.prefill({"reuse": "required"}))  # same compatibility key; the probe has not run yet
        assert again["reused"] is True
        status, body = second.decode(again["handoff"])
        assert (status, body["error"]["code"]) == (503, "unavailable")  # the probe ran first and failed
        probe = second.adapter.probe_result()
        assert probe is not None and not probe.passed
        assert second.capability("runtime.state.restore.cross_restart")["status"] == "unavailable"
        (listed,) = second.states()
        assert listed["id"] == written["state_id"] and listed["reusable"] is False  # kept, not restorable
        assert quarantined(home) == []
        status, body = second.prefill({"reuse": "required"})
        assert (status, body["error"]["code"]) == (503, "unavailable")  # state work is off for this generation


def test_a_corrupt_payload_found_after_a_restart_is_quarantined(
    home: Path, llama_server_path: Path, own_tiny: Path
) -> None:
    install(home, own_tiny)
    with hosted(home, llama_server_path) as first:
        written = ok(first.prefill())
        ok(first.decode(written["handoff"]))
    payload = payload_of(home, written["state_id"])
    with open(payload, "r+b") as f:  # one bit flipped inside llama-server's slot data
        f.seek(payload.stat().st_size // 3)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    with hosted(home, llama_server_path) as second:
        status, body = second.prefill({"reuse": "required"})
        assert (status, body["error"]["code"]) == (409, "conflict")
        assert body["error"]["details"] == {"reason": "corrupt_state"}
        assert quarantined(home) == [written["state_id"]] and second.states() == []
        assert second.adapter.probe_result() is None  # nothing recomputed


def _rewrite_payload(home: Path, state_id: str, payload: bytes) -> None:
    """Replace a stored payload and reseal its metadata (size, SHA-256, checksum) so that the
    store accepts it: only llama-server's acknowledgement can then tell."""
    state = payload_of(home, state_id).parent
    (state / "payload.bin").write_bytes(payload)
    meta = json.loads((state / "metadata.json").read_bytes())
    meta["bytes"] = len(payload)
    meta["payload_sha256"] = hashlib.sha256(payload).hexdigest()
    data = json.dumps(meta, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("ascii")
    (state / "metadata.json").write_bytes(data)
    (state / "metadata.sha256").write_bytes(checksum_text(data))


def test_a_restore_llama_server_does_not_acknowledge_exactly_is_condemned(
    home: Path, llama_server_path: Path, own_tiny: Path
) -> None:
    install(home, own_tiny)
    with hosted(home, llama_server_path) as first:
        written = ok(first.prefill())
        ok(first.decode(written["handoff"]))
    raw = payload_of(home, written["state_id"]).read_bytes()
    fd = os.open(payload_of(home, written["state_id"]), os.O_RDONLY)
    try:
        image = snapshot.read_image(fd, len(raw))
    finally:
        os.close(fd)
    lying = snapshot.SlotImage([*image.tokens, image.tokens[-1]], image.n_saved + 1, image.n_written, image.tokens_hmac)
    _rewrite_payload(home, written["state_id"], raw[: image.n_written] + lying.trailer())

    with hosted(home, llama_server_path) as second:
        again = ok(second.prefill({"reuse": "required"}))  # intact by its checksum
        status, body = second.decode(again["handoff"])
        assert (status, body["error"]["code"]) == (500, "corrupt_state")
        assert quarantined(home) == [written["state_id"]] and second.states() == []
        status, body = second.prefill({"reuse": "required"})
        assert (status, body["error"]["code"]) == (409, "conflict")  # never offered again


def test_restore_through_a_private_copy_where_no_descriptor_link_exists(
    home: Path, llama_server_path: Path, own_tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(snapshot, "_fd_link", lambda fd: None)
    install(home, own_tiny)
    with hosted(home, llama_server_path) as first:
        written = ok(first.prefill())  # the probe restored through a copy too
        original = ok(first.decode(written["handoff"], **GREEDY))
    with hosted(home, llama_server_path) as second:
        again = ok(second.prefill({"reuse": "required"}))
        assert ok(second.decode(again["handoff"], **GREEDY))["text"] == original["text"]
        assert second.adapter.last_decode["source"] == "stored"
        assert second.adapter.last_decode["prompt_n"] == 1
        proc = second.adapter.current()
        assert proc is not None and proc.slot_dir is not None
        assert list(proc.slot_dir.iterdir()) == []  # the copy is gone
