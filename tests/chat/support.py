"""Helpers of the chat tests: a chat session over the reference backend, in process."""

from __future__ import annotations

import json
from pathlib import Path

from werk_host.chat.archive import SessionDir
from werk_host.chat.native import INDEX_NAME, NativeStatus
from werk_host.chat.session import ChatSession, Sampling
from werk_host.chat.transport import LocalTransport
from werk_host.pluginhost import PluginHost
from werk_host.testing.hosts import MODEL
from werk_host.testing.reference import PLUGIN_NAME, MemoryBackendPlugin

SAMPLING = Sampling(max_tokens=8)


class Chat:
    """A chat session over a fresh local transport (a new backend "process" each time)."""

    def __init__(self, home: Path, plugin: MemoryBackendPlugin, session: str | None = "s1", **kwargs: object) -> None:
        plugins = PluginHost()
        plugins.register(plugin, PLUGIN_NAME)
        self.notes: list[str] = []
        self.warnings: list[str] = []
        self.transport = LocalTransport(home, MODEL, plugins=plugins)
        store = SessionDir(home, session) if session is not None else None
        self.session = ChatSession(
            self.transport,
            SAMPLING,
            home=home,
            store=store,
            note=self.notes.append,
            warn=self.warnings.append,
            **kwargs,  # type: ignore[arg-type]
        )
        self.adapter = plugin.adapters[-1]

    def say(self, text: str) -> str:
        out: list[str] = []
        result = self.session.ask(text, out.append)
        assert result.complete, result
        return "".join(out)

    def close(self) -> None:
        self.session.close()


def native_dir(home: Path, name: str = "s1") -> Path:
    return home / "chat-sessions" / name / "native"


def snapshot_file(home: Path, name: str = "s1") -> Path:
    index = json.loads((native_dir(home, name) / INDEX_NAME).read_text())
    return native_dir(home, name) / index["file"]


def two_turns(home: Path, plugin: MemoryBackendPlugin, name: str = "s1") -> None:
    chat = Chat(home, plugin, name)
    try:
        assert chat.session.native_report.status is NativeStatus.AVAILABLE
        assert chat.say("alpha beta") == "alpha beta"
        assert chat.say("gamma delta epsilon") == "gamma delta epsilon"
    finally:
        chat.close()
