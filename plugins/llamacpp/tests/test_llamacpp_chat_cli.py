"""``werk chat``/``werk run`` as a person types them, against a real llama-server and SmolLM2.

Every test runs the real commands (``werk chat`` in a pseudo-terminal through pexpect, ``werk
run`` as a subprocess) on the real SmolLM2-135M-Instruct GGUF: sessions resumed in new
processes with their native slot snapshots (docs/chat.md, "Native snapshots"), damaged
snapshots rebuilt from the archive, ``run --server``, Ctrl-C during generation, cleanup on
signals and the cache purge rules.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pexpect  # type: ignore[import-untyped]
import psutil  # type: ignore[import-untyped]
import pytest
from llamacpp_fakes import write_fake_server

from werk_host.plugin import ModelManifest
from werk_host.testing.host import ModelRegistry
from werk_host.testing.markers import covers_hooks
from werk_host.testing.processes import gone

pytestmark = pytest.mark.llamaserver

MODEL = "smollm2"
KEY = "sk-werk-chat-test-0123456789"
SAMPLING = ["--temperature", "0", "--seed", "7"]


@pytest.fixture
def home(tmp_path: Path, smollm2_gguf: Path) -> Path:
    home = tmp_path / "werk-home"
    home.mkdir(mode=0o700)
    ModelRegistry(home).add(ModelManifest.from_paths(MODEL, [smollm2_gguf]))
    return home


@pytest.fixture
def env(home: Path, llama_server_path: Path) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if k not in ("WERK_LLAMA_ARGS", "WERK_SERVER", "WERK_API_KEY")},
        "WERK_HOME": str(home),
        "WERK_LLAMA_SERVER": str(llama_server_path),
    }


def run(args: list[str], env: dict[str, str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "werk_host", "run", *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


def spawn_chat(args: list[str], env: dict[str, str]) -> pexpect.spawn:
    # A terminal's chat: SIGHUP in its default disposition even when the suite itself runs under
    # nohup (werk chat keeps a SIGHUP it was started ignoring ignored, werk_host/backends/managed.py).
    return pexpect.spawn(
        sys.executable,
        ["-m", "werk_host", "chat", *args],
        env=env,
        encoding="utf-8",
        timeout=180,
        dimensions=(50, 400),
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
    )


def turn(chat: pexpect.spawn, text: str) -> str:
    """Send one message and return what the terminal showed until the next prompt."""
    chat.sendline(text)
    chat.expect(">>> ")
    return str(chat.before)


def number(pattern: str, text: str) -> int:
    found = re.search(pattern, text)
    assert found is not None, f"{pattern!r} not in:\n{text}"
    return int(found.group(1))


def native(home: Path, session: str) -> Path:
    return home / "chat-sessions" / session / "native"


def archive(home: Path, session: str) -> list[dict[str, str]]:
    doc = json.loads((home / "chat-sessions" / session / "conversation.json").read_text())
    return list(doc["messages"])


def llama_children(pid: int) -> list[psutil.Process]:
    return [c for c in psutil.Process(pid).children(recursive=True) if c.name() == "llama-server" and c.is_running()]


def serving(pid: int) -> list[psutil.Process]:
    """The started server among the children (not a short ``--help`` inspection run)."""
    found = []
    for child in llama_children(pid):
        with contextlib.suppress(psutil.Error):
            if "--port" in child.cmdline():
                found.append(child)
    return found


@covers_hooks("werk_session_slot")
def test_a_chat_resumed_in_a_new_process_restores_its_snapshot_and_records_reuse(
    home: Path, env: dict[str, str]
) -> None:
    args = [MODEL, "--session", "s1", "--max-tokens", "12", "-v", *SAMPLING]
    chat = spawn_chat(args, env)
    try:
        chat.expect(r"native cache reuse: available \(no snapshot yet")
        chat.expect(">>> ")
        first = turn(chat, "My name is Ada. Please remember it.")
        assert "snapshot:" in first and "bytes saved" in first
        second = turn(chat, "What is my name?")
        prompt_2 = number(r"usage: prompt (\d+) tokens", second)
        chat.sendline("/exit")
        chat.expect(pexpect.EOF)
    finally:
        chat.close()
    assert chat.exitstatus == 0
    messages = archive(home, "s1")
    assert [m["role"] for m in messages] == ["user", "assistant"] * 2
    assert [m["content"] for m in messages[::2]] == ["My name is Ada. Please remember it.", "What is my name?"]
    assert (native(home, "s1") / "snapshot.json").exists()
    assert not (native(home, "s1") / "capability.json").exists()  # nothing was restored yet

    chat = spawn_chat(args, env)
    try:
        chat.expect("cache capability probe: skipped")
        chat.expect("session s1: 4 messages from its archive")
        chat.expect(r"native cache reuse: unverified")
        chat.expect(">>> ")
        third = turn(chat, "Say my name once more.")
        chat.sendline("/exit")
        chat.expect(pexpect.EOF)
    finally:
        chat.close()
    restored = number(r"restore: (\d+) tokens from the native snapshot", third)
    cached = number(r"native KV restored reuse observed: (\d+) of", third)
    # The turn-2 prompt and the answer generated after it were restored; the turn-3 prompt (the
    # whole archived conversation, then the new message) starts with the turn-2 prompt.
    assert cached >= prompt_2 and restored >= prompt_2
    receipt = json.loads((native(home, "s1") / "capability.json").read_text())
    assert receipt["cached_tokens"] == cached

    again = run([MODEL, "Thank you.", "--session", "s1", "--max-tokens", "4", "-v", *SAMPLING], env)
    assert again.returncode == 0, again.stderr
    assert "native cache reuse: verified" in again.stderr
    assert "native warmup: off (--no-warmup)" in again.stderr
    assert len(archive(home, "s1")) == 8

    # Native warmup on changes the effective launch arguments: the snapshot is not reused.
    warm = run([MODEL, "Bye.", "--session", "s1", "--max-tokens", "4", "--warmup-tokens", "4", "-v", *SAMPLING], env)
    assert warm.returncode == 0, warm.stderr
    assert "native warmup: on (--warmup)" in warm.stderr
    assert "native cache reuse: available" in warm.stderr and "args_sha256" in warm.stderr
    assert "restore:" not in warm.stderr

    # Purge rules: --all keeps the conversation archive, drops the native snapshot and receipt.
    listing = json.loads(
        subprocess.run(
            [sys.executable, "-m", "werk_host", "cache", "list", "--json"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    (entry,) = listing["chat_sessions"]
    assert entry["archive"]["messages"] == 10 and entry["native_snapshot"]["bytes"] > 0
    subprocess.run(
        [sys.executable, "-m", "werk_host", "cache", "purge", "--all"], env=env, check=True, capture_output=True
    )
    assert len(archive(home, "s1")) == 10
    assert not native(home, "s1").exists()


def two_turn_session(env: dict[str, str], session: str) -> None:
    for text in ("I live in a small house by the sea.", "What do I see from my window?"):
        done = run([MODEL, text, "--session", session, "--max-tokens", "16", *SAMPLING], env)
        assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("damage", ["checksum", "acknowledgement"])
def test_a_damaged_snapshot_is_rebuilt_from_the_archive_with_the_same_answer(
    home: Path, env: dict[str, str], damage: str
) -> None:
    two_turn_session(env, "bad")
    shutil.copytree(home / "chat-sessions" / "bad", home / "chat-sessions" / "good")
    shutil.rmtree(native(home, "good"))  # the control: no snapshot, so a plain full prefill
    index_path = native(home, "bad") / "snapshot.json"
    index = json.loads(index_path.read_text())
    if damage == "checksum":  # bytes changed under the index: caught by the host's SHA-256 check
        snapshot = native(home, "bad") / index["file"]
        data = bytearray(snapshot.read_bytes())
        data[len(data) // 2] ^= 0xFF
        snapshot.write_bytes(bytes(data))
    else:  # the recorded token count is wrong: caught by llama-server's restore acknowledgement
        index["backend_meta"]["n_saved"] += 1
        index_path.write_text(json.dumps(index))
    (native(home, "bad") / "capability.json").write_text("{}")  # a receipt the failure must drop
    os.chmod(native(home, "bad") / "capability.json", 0o600)

    question = ["Describe it in one sentence.", "--max-tokens", "24", "-v", *SAMPLING]
    rebuilt = run([MODEL, *question[:1], "--session", "bad", *question[1:]], env)
    control = run([MODEL, *question[:1], "--session", "good", *question[1:]], env)
    assert rebuilt.returncode == 0 and control.returncode == 0, rebuilt.stderr + control.stderr
    assert "could not be restored" in rebuilt.stderr and "rebuilding" in rebuilt.stderr
    assert "cached 0" in rebuilt.stderr  # the slot was cleared: a full prefill of the archive
    assert rebuilt.stdout.strip() and rebuilt.stdout == control.stdout
    assert not (native(home, "bad") / "capability.json").exists()
    assert (native(home, "bad") / "snapshot.json").exists()  # the complete answer saved a fresh one


@pytest.fixture
def werk_serve(home: Path, env: dict[str, str]) -> Iterator[str]:
    log = home.parent / "werk-serve.log"
    with open(log, "ab") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "werk_host", "serve", "--port", "0", "--model", MODEL],
            stdout=subprocess.PIPE,
            stderr=err,
            env={**env, "WERK_API_KEYS": KEY},
            text=True,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, f"werk serve did not start:\n{log.read_text()[-3000:]}"
        yield f"http://127.0.0.1:{json.loads(line)['port']}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_run_through_a_server_keeps_the_archive_on_the_client(
    werk_serve: str, env: dict[str, str], tmp_path: Path
) -> None:
    client = {**env, "WERK_HOME": str(tmp_path / "client"), "WERK_API_KEY": KEY}
    args = ["--server", werk_serve, "--session", "r1", "--max-tokens", "12", *SAMPLING]
    first = run([MODEL, "Name a color.", *args], client)
    second = run([MODEL, "-", *args], client, stdin="Name another one.")
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert first.stdout.strip() and second.stdout.strip()
    assert "native cache reuse: unavailable" in first.stderr
    assert "session r1: 2 messages from its archive" in second.stderr
    assert [m["content"] for m in archive(tmp_path / "client", "r1")[::2]] == ["Name a color.", "Name another one."]
    assert not native(tmp_path / "client", "r1").exists()
    refused = run([MODEL, "Hi", "--server", werk_serve], {**client, "WERK_API_KEY": "sk-not-the-key-0000"})
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1 and refused.stderr.startswith("werk: ")


def slots_idle(llama: psutil.Process) -> bool:
    """Ask the child itself whether any slot is still generating (its key is in its environment)."""
    cmdline = llama.cmdline()
    port = cmdline[cmdline.index("--port") + 1]
    key = llama.environ()["LLAMA_API_KEY"]
    request = urllib.request.Request(f"http://127.0.0.1:{port}/slots", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return not any(slot["is_processing"] for slot in json.load(answer))


def test_ctrl_c_stops_the_generation_not_the_chat(home: Path, env: dict[str, str]) -> None:
    chat = spawn_chat([MODEL, "--session", "c1", "--max-tokens", "3000", "--temperature", "0.8", "--seed", "3"], env)
    try:
        chat.expect(">>> ")
        (llama,) = llama_children(chat.pid)
        chat.sendline("Write a very long story about a dragon who bakes bread, with many chapters.")
        chat.expect("many chapters.\r\n")
        chat.expect(r"\w+ \w+ \w+")  # the answer is streaming
        chat.sendintr()
        chat.expect(r"\[interrupted\]")
        chat.expect(">>> ")
        deadline = time.monotonic() + 30
        while not slots_idle(llama) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert slots_idle(llama), "llama-server still generates for the interrupted turn"
        answer = turn(chat, "Hi!")
        assert "[interrupted]" not in answer
        chat.sendline("/exit")
        chat.expect(pexpect.EOF)
    finally:
        chat.close()
    assert chat.exitstatus == 0
    assert gone(llama.pid, timeout=15)
    assert [m["content"] for m in archive(home, "c1")[::2]] == ["Hi!"]  # the interrupted turn is not kept


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_stops_and_reaps_the_chats_llama_server(env: dict[str, str], sig: signal.Signals) -> None:
    chat = spawn_chat([MODEL], env)
    try:
        chat.expect(">>> ")
        (llama,) = llama_children(chat.pid)
        os.kill(chat.pid, sig)
        chat.expect(pexpect.EOF)
    finally:
        chat.close(force=True)
    assert gone(llama.pid, timeout=15)
    assert chat.signalstatus == sig


def test_ctrl_c_while_the_model_loads_reaps_the_child(env: dict[str, str], tmp_path: Path) -> None:
    # A server that never becomes healthy keeps the command in its blocking startup wait; a real
    # llama-server loads SmolLM2 too fast to interrupt reliably.
    fake = write_fake_server(tmp_path / "fake", serve="sleep 300")
    chat = spawn_chat([MODEL], {**env, "WERK_LLAMA_SERVER": str(fake)})
    try:
        deadline = time.monotonic() + 60
        while not serving(chat.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        (child,) = serving(chat.pid)
        chat.sendintr()
        chat.expect(pexpect.EOF)
    finally:
        chat.close(force=True)
    assert chat.exitstatus == 130
    assert gone(child.pid, timeout=15)
