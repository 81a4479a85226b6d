"""``werk run``/``werk chat`` as commands (subprocesses, a pseudo-terminal for chat) against a
served reference backend, the event-stream reader, and chat sessions in ``werk cache``.

The real-engine counterparts (local llama-server, native snapshots, Ctrl-C during generation,
signals) are in plugins/llamacpp/tests/test_llamacpp_chat_cli.py.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pexpect  # type: ignore[import-untyped]
import pytest

from tests.chat.support import two_turns
from werk_host import hookimpl
from werk_host.chat.archive import ARCHIVE_NAME, Conversation, SessionDir
from werk_host.chat.stream import read_turn
from werk_host.cli import main
from werk_host.protocol import ChatLimits
from werk_host.seam import InferenceResponse, JsonObject
from werk_host.testing.hosts import MODEL, LiveHost, install_model
from werk_host.testing.pytest_plugin import WerkServerFactory
from werk_host.testing.reference import MemoryAdapter, MemoryBackendPlugin

WERK = [sys.executable, "-m", "werk_host"]


def events(*docs: object, done: bool = True) -> list[bytes]:
    lines = [b"data: " + json.dumps(d).encode() + b"\n\n" for d in docs]
    if done:
        lines.append(b"data: [DONE]\n\n")
    # split across chunk boundaries on purpose
    raw = b"".join(lines)
    return [raw[i : i + 7] for i in range(0, len(raw), 7)]


def delta(text: str | None = None, finish: str | None = None) -> dict[str, object]:
    d = {"content": text} if text is not None else {}
    return {"choices": [{"index": 0, "delta": d, "finish_reason": finish}]}


def test_the_stream_reader_tells_complete_from_incomplete() -> None:
    seen: list[str] = []
    usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
    result = read_turn(
        events(delta("he"), delta("llo"), delta(None, "stop"), usage), seen.append, started=time.monotonic()
    )
    assert (result.text, seen, result.complete) == ("hello", ["he", "llo"], True)
    assert result.usage == {"prompt_tokens": 3, "completion_tokens": 2}
    assert result.first_token_s is not None

    cut = read_turn(events(delta("he"), done=False), seen.append, started=0.0)
    assert not cut.complete and cut.text == "he"  # no finish reason, no [DONE]
    unfinished = read_turn(events(delta("he")), seen.append, started=0.0)
    assert not unfinished.complete  # [DONE] without a finish reason
    failed = read_turn(
        events(delta("he"), {"error": {"message": "boom\nat line 2"}}, delta(None, "stop")), seen.append, started=0.0
    )
    assert not failed.complete and failed.error == "boom at line 2"
    garbage = read_turn([b"data: {oops\n\n", *events(delta("x", "stop"))], seen.append, started=0.0)
    assert not garbage.complete and garbage.error == "the server sent a malformed event"


@pytest.fixture
def served(werk_server: WerkServerFactory) -> LiveHost:
    return werk_server(MemoryBackendPlugin())


def run_cli(args: list[str], *, env: dict[str, str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WERK, *args], env=env, input=stdin, capture_output=True, text=True, timeout=120)


@pytest.fixture
def client_env(tmp_path: Path, werk_api_key: str) -> dict[str, str]:
    home = tmp_path / "client-home"
    return {**os.environ, "WERK_HOME": str(home), "WERK_API_KEY": werk_api_key}


def test_run_through_a_server_streams_the_answer_and_keeps_the_archive_on_the_client(
    served: LiveHost, client_env: dict[str, str], werk_home: Path
) -> None:
    done = run_cli(["run", MODEL, "alpha beta gamma", "--server", served.url, "--max-tokens", "8"], env=client_env)
    assert (done.returncode, done.stdout) == (0, "alpha beta gamma\n"), done.stderr

    piped = run_cli(
        ["run", MODEL, "--max-tokens", "2"], env={**client_env, "WERK_SERVER": served.url}, stdin="one two three"
    )
    assert (piped.returncode, piped.stdout) == (0, "one two\n"), piped.stderr

    args = ["--server", served.url, "--session", "r1", "--max-tokens", "8"]
    first = run_cli(["run", MODEL, "delta epsilon", *args], env=client_env)
    second = run_cli(["run", MODEL, "zeta", *args], env=client_env)
    assert first.returncode == second.returncode == 0, second.stderr
    assert "native cache reuse: unavailable" in first.stderr and "live prefix cache" in first.stderr
    assert "session r1: 2 messages from its archive" in second.stderr
    archive = Path(client_env["WERK_HOME"]) / "chat-sessions" / "r1" / ARCHIVE_NAME
    messages = Conversation.decode(archive.read_bytes()).messages
    assert [m.content for m in messages] == ["delta epsilon", "delta epsilon", "zeta", "zeta"]
    assert not (werk_home / "chat-sessions").exists()  # nothing of it on the server


@pytest.mark.parametrize(
    ("args", "env_change", "status", "text"),
    [
        (
            ["--server", "{url}"],
            {"WERK_API_KEY": "sk-wrong-key-000"},
            1,
            "werk: the server at {url} did not accept the API key in WERK_API_KEY (set WERK_API_KEY to one of its keys)",
        ),
        (
            ["--server", "{url}"],
            {"WERK_API_KEY": ""},
            1,
            "werk: the server at {url} requires an API key (set WERK_API_KEY)",
        ),
        (
            ["--server", "127.0.0.1:9"],
            {},
            1,
            "werk: cannot reach werk serve at http://127.0.0.1:9: connection refused "
            "(start it with `werk serve`, or pass --server URL or set WERK_SERVER)",
        ),
        (["--server", "https://example.com:1"], {}, 2, "only http://"),
        (["--server", "{url}", "--max-tokens", "5000"], {}, 2, "allows at most 63 (pass a smaller --max-tokens)"),
        (["--server", "{url}", "--session", "../x"], {}, 2, "invalid session name"),
    ],
)
def test_run_fails_with_one_line(
    served: LiveHost,
    client_env: dict[str, str],
    args: list[str],
    env_change: dict[str, str],
    status: int,
    text: str,
) -> None:
    argv = ["run", MODEL, "hello", *(a.format(url=served.url) for a in args)]
    done = run_cli(argv, env={**client_env, **env_change})
    assert done.returncode == status, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and text.format(url=served.url) in lines[0], done.stderr
    assert done.stdout == ""
    assert "sk-" not in done.stderr


class RecordingAdapter(MemoryAdapter):
    """The reference adapter, keeping each chat request body it gets in its plugin's ``bodies``;
    its plugin's ``limits`` replace fields of its chat limits, and its plugin's ``gate`` holds
    each streamed answer after its first word until set."""

    plugin: Recording

    @hookimpl(specname="werk_chat_limits")
    def chat_limits(self, model: str | None) -> ChatLimits:
        return super().chat_limits(model).model_copy(update=self.plugin.limits)

    @hookimpl(specname="werk_chat_completion")
    def chat_completion(self, request: JsonObject) -> InferenceResponse:
        self.plugin.bodies.append(dict(request))
        response = super().chat_completion(request)
        gate = self.plugin.gate
        if gate is None:
            return response

        def held() -> Iterator[bytes]:
            for index, chunk in enumerate(response.body):
                yield chunk
                if index == 1:  # the role event, then the first word: hold the rest
                    gate.wait(60)

        return InferenceResponse(response.status, response.headers, held(), response.close)


class Recording(MemoryBackendPlugin):
    """The reference backend, keeping each chat request body it gets; ``limits`` replaces fields
    of its chat limits, and a ``gate`` holds each streamed answer after its first word until set
    (:class:`RecordingAdapter`)."""

    adapter_class = RecordingAdapter

    def __init__(self, *, limits: Mapping[str, Any] | None = None, gate: threading.Event | None = None) -> None:
        super().__init__()
        self.limits = dict(limits or {})
        self.gate = gate
        self.bodies: list[JsonObject] = []


def test_run_takes_the_prompt_after_the_options_and_host_port_without_a_scheme(
    served: LiveHost, client_env: dict[str, str]
) -> None:
    bare = served.url.removeprefix("http://")
    after = run_cli(["run", MODEL, "--server", served.url, "--max-tokens", "8", "alpha beta"], env=client_env)
    assert (after.returncode, after.stdout) == (0, "alpha beta\n"), after.stderr
    before = run_cli(["run", MODEL, "gamma", "--server", bare, "--max-tokens", "8"], env=client_env)
    assert (before.returncode, before.stdout) == (0, "gamma\n"), before.stderr
    piped = run_cli(["run", MODEL, "--server", bare, "--max-tokens", "8", "-"], env=client_env, stdin="delta")
    assert (piped.returncode, piped.stdout) == (0, "delta\n"), piped.stderr
    two = run_cli(["run", MODEL, "--server", bare, "one", "two"], env=client_env)
    assert two.returncode == 2 and "unrecognized arguments: two" in two.stderr  # one PROMPT, quoted


def test_run_json_prints_the_answer_and_errors_as_json(served: LiveHost, client_env: dict[str, str]) -> None:
    done = run_cli(
        ["run", MODEL, "delta epsilon", "--server", served.url, "--max-tokens", "1", "--json"], env=client_env
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["text"], doc["finish_reason"], doc["model"]) == ("delta", "length", MODEL)
    assert doc["usage"]["completion_tokens"] == 1
    refused = run_cli(["run", MODEL, "hi", "--server", "127.0.0.1:9", "--json"], env=client_env)
    assert refused.returncode == 1 and refused.stdout == ""
    error = json.loads(refused.stderr)["error"]
    assert error["code"] == "unavailable" and "cannot reach werk serve" in error["message"]
    assert "werk serve" in error["fix"]


@pytest.mark.parametrize(
    ("limits", "sent"),
    [
        ({"max_output_tokens": None, "context_tokens": None}, 512),  # no ceiling: the default
        ({"max_output_tokens": 40, "context_tokens": None}, 40),  # the model's output ceiling
        ({}, 32),  # the reference model: ceiling 63, context 64 -> half the context
    ],
)
def test_an_answer_has_a_default_length(
    werk_server: WerkServerFactory, client_env: dict[str, str], limits: dict[str, Any], sent: int
) -> None:
    plugin = Recording(limits=limits)
    served = werk_server(plugin)
    done = run_cli(["run", MODEL, "alpha", "--server", served.url, "-v"], env=client_env)
    assert done.returncode == 0, done.stderr
    assert plugin.bodies[-1]["max_tokens"] == sent
    assert f"answer length: at most {sent} tokens" in done.stderr
    explicit = run_cli(["run", MODEL, "alpha", "--server", served.url, "--max-tokens", "3"], env=client_env)
    assert explicit.returncode == 0 and plugin.bodies[-1]["max_tokens"] == 3, explicit.stderr
    helped = run_cli(["chat", "--help"], env=client_env)
    assert "default 512" in " ".join(helped.stdout.split())


def test_keys_typed_while_an_answer_streams_are_not_echoed_or_kept(
    werk_server: WerkServerFactory, client_env: dict[str, str]
) -> None:
    gate = threading.Event()
    plugin = Recording(gate=gate)
    served = werk_server(plugin)
    chat = spawn_chat([MODEL, "--server", served.url, "--max-tokens", "8"], client_env)
    seen = io.StringIO()
    chat.logfile_read = seen
    try:
        chat.expect(">>> ")
        chat.sendline("alpha beta gamma")
        chat.expect_exact("alpha beta gamma\r\n")  # the line as typed
        chat.expect_exact("alpha")  # the answer's first word: the rest is held at the gate
        chat.send("zzqq")  # typed while the answer streams
        gate.set()
        chat.expect_exact(" beta gamma")
        chat.expect(">>> ")
        chat.sendline("delta")
        chat.expect_exact("delta\r\n")
        chat.expect(">>> ")
        chat.sendline("/exit")
        chat.expect(pexpect.EOF)
    finally:
        gate.set()
        chat.close()
    assert chat.exitstatus == 0
    assert "zzqq" not in seen.getvalue()  # not echoed into the answer, not shown at the next prompt
    assert plugin.bodies[-1]["messages"][-1]["content"] == "delta"  # discarded, not prepended


def spawn_chat(args: list[str], env: dict[str, str]) -> pexpect.spawn:
    return pexpect.spawn(sys.executable, ["-m", "werk_host", "chat", *args], env=env, encoding="utf-8", timeout=60)


def test_chat_in_a_terminal_through_a_server(served: LiveHost, client_env: dict[str, str]) -> None:
    chat = spawn_chat([MODEL, "--server", served.url, "--session", "c1", "--max-tokens", "8"], client_env)
    try:
        chat.expect("native cache reuse: unavailable")
        chat.expect(">>> ")
        chat.sendline("alpha beta")
        chat.expect("alpha beta")
        chat.expect(">>> ")
        chat.sendintr()  # Ctrl-C at the prompt: a fresh prompt, not the end
        chat.expect(">>> ")
        chat.sendline("/help")
        chat.expect("/save NAME")
        chat.expect(">>> ")
        chat.sendline("/save c2")
        chat.expect("saved as session c2")
        chat.expect(">>> ")
        chat.sendline("gamma")
        chat.expect("gamma")
        chat.expect(">>> ")
        chat.sendline("/bogus")
        chat.expect("unknown command /bogus")
        chat.expect(">>> ")
        chat.sendline("/exit")
        chat.expect(pexpect.EOF)
    finally:
        chat.close()
    assert chat.exitstatus == 0
    home = Path(client_env["WERK_HOME"])
    c1 = Conversation.decode((home / "chat-sessions" / "c1" / ARCHIVE_NAME).read_bytes())
    c2 = Conversation.decode((home / "chat-sessions" / "c2" / ARCHIVE_NAME).read_bytes())
    assert [m.content for m in c1.messages] == ["alpha beta"] * 2
    assert [m.content for m in c2.messages] == ["alpha beta"] * 2 + ["gamma"] * 2

    resumed = spawn_chat([MODEL, "--server", served.url, "--session", "c2", "--max-tokens", "8"], client_env)
    try:
        resumed.expect("session c2: 4 messages from its archive")
        resumed.expect(">>> ")
        resumed.sendline("/reset")
        resumed.expect("conversation cleared")
        resumed.expect(">>> ")
        resumed.sendeof()
        resumed.expect(pexpect.EOF)
    finally:
        resumed.close()
    assert resumed.exitstatus == 0
    assert Conversation.decode((home / "chat-sessions" / "c2" / ARCHIVE_NAME).read_bytes()).messages == []


def cache(home: Path, capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    capsys.readouterr()
    assert main(["cache", *args, "--home", str(home), "--json"]) == 0
    parsed: dict[str, object] = json.loads(capsys.readouterr().out)
    return parsed


def test_cache_inventory_and_purge_rules(werk_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    install_model(werk_home)
    plugin = MemoryBackendPlugin()
    for name in ("a", "b", "busy"):
        two_turns(werk_home, plugin, name)
    by_id: Callable[[dict[str, object]], dict[str, dict[str, object]]] = lambda listing: {  # noqa: E731
        str(e["id"]): e
        for e in listing["chat_sessions"]  # type: ignore[attr-defined]
    }

    held = SessionDir(werk_home, "busy")  # a running chat holds its session
    try:
        listing = cache(werk_home, capsys, "list")
        entries = by_id(listing)
        assert set(entries) == {"chat:a", "chat:b", "chat:busy"}
        a = entries["chat:a"]
        assert a["archive"]["messages"] == 4 and a["archive"]["model"] == MODEL  # type: ignore[index]
        assert a["native_snapshot"]["id"] == "chat:a/native" and a["native_snapshot"]["bytes"] > 0  # type: ignore[index]
        assert entries["chat:busy"]["active"] is True and a["active"] is False
        assert listing["totals"]["chat_sessions_active"] == 1  # type: ignore[index]
        assert main(["cache", "list", "--home", str(werk_home)]) == 0  # the table: a row per part
        rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:-1]}
        assert "chat archive (4 messages)" in rows["chat:a"] and MODEL in rows["chat:a"]
        assert "chat snapshot" in rows["chat:a/native"] and rows["chat:busy"].split()[-2:] == ["active", "disk"]

        preview = cache(werk_home, capsys, "purge", "--all", "--dry-run")
        assert {e["id"] for e in preview["chat_sessions"]} == {"chat:a/native", "chat:b/native"}  # type: ignore[attr-defined]
        assert by_id(cache(werk_home, capsys, "list")) == entries  # a dry run changes nothing

        purged = cache(werk_home, capsys, "purge", "--all")
        assert purged["chat_sessions_skipped_active"] == ["chat:busy"]
        after = by_id(cache(werk_home, capsys, "list"))
        assert after["chat:a"]["native_snapshot"] is None and after["chat:a"]["archive"] is not None
        assert after["chat:busy"]["native_snapshot"] is not None  # active: untouched

        gone = cache(werk_home, capsys, "purge", "--all", "--include-chat-sessions")
        assert {e["id"] for e in gone["chat_sessions"]} == {"chat:a", "chat:b"}  # type: ignore[attr-defined]
        assert set(by_id(cache(werk_home, capsys, "list"))) == {"chat:busy"}
        assert main(["cache", "purge", "chat:busy", "--home", str(werk_home)]) == 1  # active: refused
    finally:
        held.close()
    assert cache(werk_home, capsys, "purge", "chat:busy/native")["chat_sessions"][0]["id"] == "chat:busy/native"  # type: ignore[index]
    assert cache(werk_home, capsys, "purge", "chat:busy")["chat_sessions"][0]["part"] == "session"  # type: ignore[index]
    assert not (werk_home / "chat-sessions" / "busy").exists()
