from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from werk_llamacpp.native import InvalidSlotError, LlamaServerClient, NativeConnectionError, NativeHTTPError
from werk_llamacpp.process import LlamaServerProcess

pytestmark = pytest.mark.llamaserver


def _client(server: LlamaServerProcess) -> LlamaServerClient:
    assert server.client is not None
    return server.client


def test_completion_counters_and_cache(server: LlamaServerProcess) -> None:
    c = _client(server)
    c.slot_erase(0)
    prompt = "the model will save this state and the server will restore it " * 4
    n = len(c.tokenize(prompt, add_special=True))
    first = c.completion(prompt, id_slot=0, n_predict=4, temperature=0.0, return_tokens=True)
    assert first.id_slot == 0
    assert first.tokens_evaluated == n
    assert first.prompt_n == n and first.cache_n == 0
    assert first.predicted_n == 4 and len(first.tokens) == 4
    assert first.tokens_cached == n + 4 - 1  # the last sampled token is not yet in the KV cache
    again = c.completion(prompt, id_slot=0, n_predict=4, temperature=0.0)
    assert again.tokens_evaluated == n
    assert again.cache_n == n - 1 and again.prompt_n == 1  # the last prompt token is always recomputed


def test_slot_save_erase_restore_counters(server: LlamaServerProcess) -> None:
    c = _client(server)
    assert server.slot_dir is not None
    prompt = "save erase restore " * 10
    c.slot_erase(1)
    done = c.completion(prompt, id_slot=1, n_predict=0)
    n = done.tokens_evaluated
    assert n is not None
    # this llama-server still samples one token for n_predict=0 but does not evaluate it
    assert done.tokens_cached == n
    saved = c.slot_save(1, "native-test.bin")
    assert saved.id_slot == 1 and saved.filename == "native-test.bin"
    assert saved.n_saved == n
    assert (server.slot_dir / "native-test.bin").stat().st_size == saved.n_written
    assert c.slot_erase(1).n_erased == saved.n_saved
    restored = c.slot_restore(1, "native-test.bin")
    assert restored.n_restored == saved.n_saved and restored.n_read == saved.n_written
    replay = c.completion(prompt, id_slot=1, n_predict=1)
    assert replay.cache_n == n - 1 and replay.prompt_n == 1
    (server.slot_dir / "native-test.bin").unlink()


def test_slots_listing(server: LlamaServerProcess) -> None:
    slots = _client(server).slots()
    assert [s.id for s in slots] == [0, 1]
    assert all(s.n_ctx and s.n_ctx > 0 for s in slots)
    assert not any(s.is_processing for s in slots)


def test_http_errors_are_typed(server: LlamaServerProcess) -> None:
    c = _client(server)
    with pytest.raises(NativeHTTPError) as err:
        c.slot_restore(0, "does-not-exist.bin")
    assert err.value.status >= 400
    with pytest.raises(NativeHTTPError) as err:
        c.slot_save(0, "../escape.bin")
    assert err.value.status == 400
    status, _ = c.request("POST", "/slots/abc?action=erase", {})
    assert status == 400


def test_out_of_range_slot_ids_wrap_around(server: LlamaServerProcess) -> None:
    """llama-server maps id_slot modulo the slot count, so the managed client range-checks ids itself."""
    assert server.port is not None
    raw = LlamaServerClient("127.0.0.1", server.port, api_key=server.api_key)  # no n_slots: no client-side check
    done = raw.completion("wrap around", id_slot=1, n_predict=1)
    assert done.tokens_cached is not None and done.tokens_cached > 0
    erased = raw.slot_erase(3)  # 3 % 2 == 1
    assert erased.id_slot == 3 and erased.n_erased == done.tokens_cached
    raw.close()
    c = _client(server)
    assert c.n_slots == 2
    for bad in (2, 3, -2):
        with pytest.raises(InvalidSlotError):
            c.slot_erase(bad)
        with pytest.raises(InvalidSlotError):
            c.completion("x", id_slot=bad, n_predict=1)
    with pytest.raises(InvalidSlotError):
        c.slot_erase(-1)
    assert c.completion("x", id_slot=-1, n_predict=1).id_slot in (0, 1)


def test_random_output_is_bytes_safe(server: LlamaServerProcess) -> None:
    c = _client(server)
    for seed in range(3):
        res = c.completion(
            "\u00e9\u00e8 bytes", n_predict=48, temperature=1.5, top_k=0, top_p=1.0, seed=seed, ignore_eos=True
        )
        assert isinstance(res.content, str) and res.predicted_n == 48


def test_killed_mid_request_is_a_connection_error(llama_server_path: Path, tiny_model: Path) -> None:
    proc = LlamaServerProcess(tiny_model, binary=llama_server_path, ctx=4096, env_args="").start()
    try:
        assert proc.client is not None and proc.pid is not None
        errors: list[BaseException] = []

        def run() -> None:
            try:
                proc.client.completion("long", n_predict=4000, ignore_eos=True)  # type: ignore[union-attr]
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        t = threading.Thread(target=run)
        t.start()
        time.sleep(0.3)
        import os
        import signal

        os.kill(proc.pid, signal.SIGKILL)
        t.join(timeout=30)
        assert errors and isinstance(errors[0], NativeConnectionError)
    finally:
        proc.stop()
    with pytest.raises(NativeConnectionError):
        LlamaServerClient("127.0.0.1", proc.port or 1, timeout=2).health()
