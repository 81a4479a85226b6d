"""Chat sessions over the reference backend, in process: archive, native snapshots and their rules.

The reference backend's session slot reuses the common token prefix of consecutive session
chats and reports it as ``cached_tokens`` (werk_host.testing.reference.MemorySessionSlot),
so every rule of docs/chat.md ("Native snapshots") is observable here without a real engine;
plugins/llamacpp/tests/test_llamacpp_chat_cli.py runs the same rules against llama-server.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.chat.support import Chat, native_dir, snapshot_file, two_turns
from werk_host import hookimpl
from werk_host.chat.archive import ARCHIVE_NAME, MAX_MESSAGES, Conversation, Message, SessionDir
from werk_host.chat.native import INDEX_NAME, RECEIPT_NAME, NativeStatus
from werk_host.config import HostConfig
from werk_host.errors import ErrorCode, WerkError
from werk_host.hooks import BackendHooks
from werk_host.pluginhost import PluginHost
from werk_host.seam import JsonObject
from werk_host.testing.hosts import MODEL
from werk_host.testing.markers import covers_hooks
from werk_host.testing.reference import PLUGIN_NAME, MemoryAdapter, MemoryBackendPlugin, MemorySessionSlot


@covers_hooks("werk_session_slot")
def test_the_hook_hands_out_a_typed_session_slot(home: Path) -> None:
    plugin = MemoryBackendPlugin()
    plugins = PluginHost()
    plugins.register(plugin, PLUGIN_NAME)
    adapter = plugin.create(HostConfig(home=home), None)
    slot = BackendHooks(plugins).session_slot(adapter, "none")
    assert isinstance(slot, MemorySessionSlot)
    assert "generation" not in slot.session_key()  # a snapshot is meant to outlive its process

    class Broken(MemoryAdapter):
        @hookimpl(specname="werk_session_slot")
        def open_session_slot(self, model_id: str) -> object:  # type: ignore[override]
            return {"not": "snapshots"}

    class BrokenPlugin(MemoryBackendPlugin):
        adapter_class = Broken

    broken_plugin = BrokenPlugin()
    broken = PluginHost()
    broken.register(broken_plugin, PLUGIN_NAME)
    with pytest.raises(WerkError) as err:
        BackendHooks(broken).session_slot(broken_plugin.create(HostConfig(home=home), None), "none")
    assert err.value.code is ErrorCode.INTERNAL and "SessionSlot" in err.value.message


def test_a_resumed_session_restores_lazily_and_records_observed_reuse(home: Path) -> None:
    plugin = MemoryBackendPlugin()
    two_turns(home, plugin)
    archive = Conversation.decode((home / "chat-sessions" / "s1" / ARCHIVE_NAME).read_bytes())
    assert [m.content for m in archive.messages] == ["alpha beta"] * 2 + ["gamma delta epsilon"] * 2
    assert not (native_dir(home) / RECEIPT_NAME).exists()  # nothing was restored yet: no evidence

    second = Chat(home, plugin)  # a new backend "process": its session slot is empty
    try:
        assert second.session.resumed == 4
        assert second.session.native_report.status is NativeStatus.UNVERIFIED
        assert "session_restore" not in second.adapter.calls  # opening a session restores nothing
        assert second.adapter.session_slot == []
        assert second.say("zeta") == "zeta"
        assert second.adapter.calls.count("session_restore") == 1
        restore = next(n for n in second.notes if n.startswith("restore:"))
        assert "verified" in restore
        observed = next(n for n in second.notes if "restored reuse observed" in n)
        # The restored slot holds the last prompt (3 messages: 4 + 4 + 5 tokens) and the 3 words
        # generated after it; the new prompt (5 messages, 21 tokens) shares those 13 tokens.
        assert observed.startswith("native KV restored reuse observed: 13 of 21")
        assert second.say("eta") == "eta"
        assert second.adapter.calls.count("session_restore") == 1  # only the first request restores
    finally:
        second.close()
    receipt = json.loads((native_dir(home) / RECEIPT_NAME).read_text())
    assert receipt["cached_tokens"] == 13 and receipt["prompt_tokens"] == 21

    third = Chat(home, plugin)
    try:
        assert third.session.native_report.status is NativeStatus.VERIFIED
        assert "session_restore" not in third.adapter.calls  # a receipt never triggers work by itself
        assert third.say("theta") == "theta"
    finally:
        third.close()


def test_every_file_is_private(home: Path) -> None:
    two_turns(home, MemoryBackendPlugin())
    for root, dirs, files in os.walk(home / "chat-sessions"):
        for name in dirs:
            assert os.stat(os.path.join(root, name)).st_mode & 0o777 == 0o700
        for name in files:
            assert os.stat(os.path.join(root, name)).st_mode & 0o777 == 0o600, name


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_snapshot_is_never_loaded_and_the_conversation_is_rebuilt(home: Path, damage: str) -> None:
    plugin = MemoryBackendPlugin()
    two_turns(home, plugin, "good")
    two_turns(home, plugin, "bad")
    path = snapshot_file(home, "bad")
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x20
    else:
        del data[-3:]
    path.write_bytes(bytes(data))
    # a receipt from an earlier observed reuse must be invalidated by the failure
    (native_dir(home, "bad") / RECEIPT_NAME).write_text((native_dir(home, "bad") / INDEX_NAME).read_text())

    chat = Chat(home, plugin, "bad")
    try:
        answer = chat.say("zeta")
        usage_note = next(n for n in chat.notes if n.startswith("usage:"))
    finally:
        chat.close()
    assert answer == "zeta"
    assert any("could not be restored" in w and "rebuilding" in w for w in chat.warnings)
    assert "cached 0" in usage_note  # the slot was cleared: a full prefill from the archive
    assert not (native_dir(home, "bad") / RECEIPT_NAME).exists()
    assert (native_dir(home, "bad") / INDEX_NAME).exists()  # the complete answer published a fresh one

    control = Chat(home, plugin, "good")
    try:
        assert control.say("zeta") == answer
    finally:
        control.close()


def test_a_backend_restore_failure_clears_the_slot_and_rebuilds(home: Path) -> None:
    plugin = MemoryBackendPlugin()
    two_turns(home, plugin)
    plugin.fail = {"session_restore"}
    chat = Chat(home, plugin)
    try:
        chat.adapter.session_slot = ["<user>"]
        assert chat.say("zeta") == "zeta"
        assert any("could not be restored" in w for w in chat.warnings)
        assert any(n.startswith("usage:") and "cached 0" in n for n in chat.notes)  # the slot was cleared
        assert not any("restored reuse observed" in n for n in chat.notes)
    finally:
        chat.close()


def test_a_snapshot_from_another_runtime_is_not_restored(home: Path) -> None:
    plugin = MemoryBackendPlugin()
    two_turns(home, plugin)
    index_path = native_dir(home) / INDEX_NAME
    index = json.loads(index_path.read_text())
    index["envelope"]["layout"] = "session-0"
    index_path.write_text(json.dumps(index))
    chat = Chat(home, plugin)
    try:
        report = chat.session.native_report
        assert report.status is NativeStatus.AVAILABLE and "layout" in report.detail
        chat.say("zeta")
        assert "session_restore" not in chat.adapter.calls
    finally:
        chat.close()


def test_a_zero_or_missing_cache_count_records_no_reuse(home: Path) -> None:
    plugin = MemoryBackendPlugin()
    two_turns(home, plugin)
    # another system message changes the first tokens: the restored prefix cannot match
    chat = Chat(home, plugin, system="be brief")
    try:
        chat.say("zeta")
        assert any("cache miss, not proof of a broken restore" in n for n in chat.notes)
    finally:
        chat.close()
    assert not (native_dir(home) / RECEIPT_NAME).exists()

    class Uncounted(MemorySessionSlot):
        def cached_tokens(self, usage_event: JsonObject) -> int | None:
            return None

    class NoCountsAdapter(MemoryAdapter):
        @hookimpl(specname="werk_session_slot")
        def open_session_slot(self, model_id: str) -> MemorySessionSlot:
            return Uncounted(self.plugin, self)

    class NoCounts(MemoryBackendPlugin):
        adapter_class = NoCountsAdapter

    chat = Chat(home, NoCounts())
    try:
        chat.say("eta")
        assert any("missing or inconsistent" in n for n in chat.notes)
    finally:
        chat.close()
    assert not (native_dir(home) / RECEIPT_NAME).exists()


def test_an_interrupted_turn_keeps_nothing(home: Path) -> None:
    plugin = MemoryBackendPlugin()
    two_turns(home, plugin)
    index_before = (native_dir(home) / INDEX_NAME).read_bytes()
    chat = Chat(home, plugin)
    try:

        def stop(text: str) -> None:
            raise KeyboardInterrupt

        result = chat.session.ask("zeta eta theta", stop)
        assert result.interrupted and not result.complete
        assert len(chat.session.conversation.messages) == 4
    finally:
        chat.close()
    assert (native_dir(home) / INDEX_NAME).read_bytes() == index_before  # no snapshot published
    assert not (native_dir(home) / RECEIPT_NAME).exists()  # an incomplete stream proves nothing
    assert len(Conversation.decode((home / "chat-sessions" / "s1" / ARCHIVE_NAME).read_bytes()).messages) == 4


def test_reset_and_save_as(home: Path) -> None:
    plugin = MemoryBackendPlugin()
    chat = Chat(home, plugin, session=None, system="be brief")
    try:
        assert chat.session.native_report.status is NativeStatus.UNAVAILABLE  # no session, nothing kept
        chat.say("alpha")
        report = chat.session.save_as("kept")
        assert report.status is NativeStatus.AVAILABLE
        chat.say("beta")
        other = SessionDir(home, "other")
        other.save(Conversation(MODEL))
        other.close()
        with pytest.raises(WerkError, match="already exists"):
            chat.session.save_as("other")
        chat.session.reset()
        assert [m.role for m in chat.session.conversation.messages] == ["system"]
    finally:
        chat.close()
    saved = Conversation.decode((home / "chat-sessions" / "kept" / ARCHIVE_NAME).read_bytes())
    assert [m.content for m in saved.messages] == ["be brief"]
    assert not (native_dir(home, "kept") / INDEX_NAME).exists()  # a reset conversation has no snapshot


def test_a_session_is_used_by_one_process_and_one_model(home: Path) -> None:
    held = SessionDir(home, "s1")
    try:
        with pytest.raises(WerkError, match="in use"):
            SessionDir(home, "s1")
    finally:
        held.close()
    store = SessionDir(home, "s1")
    store.save(Conversation("other", ("0" * 64,), [Message("user", "hi")]))
    store.close()
    with pytest.raises(WerkError, match="model other"):
        Chat(home, MemoryBackendPlugin())


def test_archives_are_bounded_and_never_half_read(home: Path) -> None:
    store = SessionDir(home, "s1")
    try:
        too_many = Conversation(MODEL, (), [Message("user", "x")] * (MAX_MESSAGES + 1))
        with pytest.raises(WerkError) as err:
            store.save(too_many)
        assert err.value.code is ErrorCode.RESOURCE_EXHAUSTED
        assert store.load() is None  # the refused save wrote nothing
        path = home / "chat-sessions" / "s1" / ARCHIVE_NAME
        path.write_text("{not json")
        path.chmod(0o600)
        with pytest.raises(WerkError) as err:
            store.load()
        assert err.value.code is ErrorCode.CORRUPT_STATE
        path.write_bytes(Conversation(MODEL).encode())
        path.chmod(0o644)
        with pytest.raises(WerkError, match="not private"):
            store.load()
        path.unlink()
        path.symlink_to(home / "elsewhere.json")
        with pytest.raises(WerkError, match="not a regular file"):
            store.load()
    finally:
        store.close()


@pytest.mark.parametrize("receipt", ["{broken", "x" * (64 << 10), '{"schema": "werk-chat-probe-receipt/0"}'])
def test_a_bad_receipt_leaves_reuse_unverified_and_runs_nothing(home: Path, receipt: str) -> None:
    plugin = MemoryBackendPlugin()
    two_turns(home, plugin)
    path = native_dir(home) / RECEIPT_NAME
    path.write_text(receipt)
    path.chmod(0o600)
    chat = Chat(home, plugin)
    try:
        assert chat.session.native_report.status is NativeStatus.UNVERIFIED
        assert not any(call.startswith("session") for call in chat.adapter.calls)  # no work at open
    finally:
        chat.close()
