"""werk_host.backends.launch: a ``werk serve`` start spawns the child its last start planned,
before the host is imported, and the plan adopts it only when it is exactly that child.

Every child is a real process: a small Python HTTP server that binds the port it is given and
answers ``GET /health``. The ``werk serve`` words are only read for the home, the key and the
command; the plan is the test's own ``reserve`` → ``ManagedProcess`` sequence, as a plugin does.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from werk_host.backends import launch
from werk_host.backends.managed import ManagedProcess, http_ready
from werk_host.backends.records import read_record
from werk_host.paths import ensure_private_dir
from werk_host.testing.processes import gone

pytestmark = pytest.mark.skipif(launch.unavailable() is not None, reason=str(launch.unavailable()))

SERVER = textwrap.dedent(
    """
    import http.server, os, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])
    assert os.environ["DEMO_KEY"]
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
    """
)


@dataclass
class Started:
    reservation: launch.Reservation
    process: ManagedProcess
    prestarted: int | None
    """The pid of the child prestarted for this start, if one was."""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "demo_server.py"
    path.write_text(SERVER)
    return path


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    yield ensure_private_dir(tmp_path / "home")
    launch.settle()


def prestart(words: Sequence[str], listen: tuple[str, int] = ("127.0.0.1", 0)) -> None:
    launch.prestart(words, listen=listen)


def serve_words(home: Path, port: int = 8080, *more: str) -> list[str]:
    return ["serve", "--model", "demo.gguf", "--home", str(home), "--port", str(port), *more]


def start(home: Path, script: Path, *, words: Sequence[str] | None = None, extra: Sequence[str] = ()) -> Started:
    """One ``werk serve`` start as a plugin makes it: prestart, reserve, spawn or adopt, ready, settle."""
    prestart(serve_words(home) if words is None else words)
    prestarted = prestarted_pid(home)
    work = ensure_private_dir(home / "backends" / "demo")
    reservation = launch.reserve("demo", work, prefix="gen-", host="127.0.0.1")
    ensure_private_dir(reservation.run_dir / "data")
    argv = [sys.executable, str(script), "--port", str(reservation.port), "--data", f"{reservation.run_dir}/data"]
    process = ManagedProcess(
        [*argv, *extra],
        log_path=reservation.run_dir / "demo.log",
        env={**os.environ, "DEMO_KEY": reservation.secret},
        cwd=reservation.run_dir,
        record_dir=reservation.run_dir,
        secrets=(reservation.secret,),
        cleanup_dir=reservation.run_dir,
        owner_fd=reservation.owner_fd,
        launch=reservation,
    )
    process.start()
    try:
        process.wait_ready(http_ready("127.0.0.1", reservation.port), timeout=30)
    finally:
        launch.settle()
    return Started(reservation, process, prestarted)


def memo(home: Path) -> dict[str, object]:
    data = json.loads((home / "launches" / "v1.json").read_text())
    assert data["version"] == 1
    launches: dict[str, object] = data["launches"]
    return launches


def prestarted_pid(home: Path) -> int | None:
    """The pid of the child the last :func:`launch.prestart` spawned (from its run directory's record)."""
    if not launch.loading():
        return None
    records = [read_record(d) for d in (home / "backends" / "demo").glob("gen-*")]
    pids = [r.pid for r in records if r is not None and not gone(r.pid, timeout=0)]
    assert len(pids) == 1, pids
    return pids[0]


def test_a_ready_child_is_remembered_as_a_template_without_its_secret(home: Path, script: Path) -> None:
    first = start(home, script)
    try:
        path = home / "launches" / "v1.json"
        assert path.stat().st_mode & 0o777 == 0o600
        text = path.read_text()
        assert first.reservation.secret not in text
        assert first.reservation.generation not in text
        assert f'"{first.reservation.port}"' not in text
        (entry,) = memo(home).values()
        assert isinstance(entry, dict)
        assert entry["argv"][3] == [{"$": "port"}]
        assert entry["argv"][5] == [{"$": "run_dir"}, "/data"]
        assert entry["env_set"] == {"DEMO_KEY": [{"$": "secret"}]}
        assert entry["dirs"] == ["data"]
        assert set(entry["files"]) == {sys.executable, str(script)}
        assert entry["rss"] > 0
    finally:
        first.process.stop()


def test_the_next_start_of_the_command_adopts_the_child_it_spawned_before_the_plan(home: Path, script: Path) -> None:
    start(home, script).process.stop()
    prestart(serve_words(home, port=9090))  # another listen port: the same command
    pid = prestarted_pid(home)
    assert pid is not None
    launch.settle()
    assert gone(pid)  # nobody claimed it
    assert not list((home / "backends" / "demo").glob("gen-*"))

    second = start(home, script, words=serve_words(home, port=9191))
    try:
        assert second.prestarted is not None and second.process.pid == second.prestarted
        record = read_record(second.reservation.run_dir)
        assert record is not None and record.pid == second.prestarted
        assert str(second.reservation.port) in record.cmdline  # the fresh port it answers on
        assert second.process.alive()
        (entry,) = memo(home).values()  # unchanged: the same template, one entry
    finally:
        second.process.stop()


def test_a_prestarted_child_is_adopted_only_when_it_is_exactly_the_planned_one(home: Path, script: Path) -> None:
    start(home, script).process.stop()
    prestart(serve_words(home))
    pid = prestarted_pid(home)
    assert pid is not None
    work = home / "backends" / "demo"
    reservation = launch.reserve("demo", work, prefix="gen-", host="127.0.0.1")
    assert reservation.prestarted is not None and reservation.prestarted.child.pid == pid
    process = ManagedProcess(
        [sys.executable, str(script), "--port", str(reservation.port), "--data", f"{reservation.run_dir}/data", "-v"],
        log_path=reservation.run_dir / "demo.log",
        env={**os.environ, "DEMO_KEY": reservation.secret},
        cwd=reservation.run_dir,
        cleanup_dir=reservation.run_dir,
        owner_fd=reservation.owner_fd,
        launch=reservation,
    )
    try:
        process.start()
        assert gone(pid), "a different plan must kill the prestarted child"
        assert process.pid != pid
        process.wait_ready(http_ready("127.0.0.1", reservation.port), timeout=30)
    finally:
        process.stop()
    assert not reservation.run_dir.exists()


def test_another_backend_or_work_directory_discards_the_prestarted_child(home: Path, script: Path) -> None:
    start(home, script).process.stop()
    prestart(serve_words(home))
    pid = prestarted_pid(home)
    assert pid is not None
    other = launch.reserve("other", ensure_private_dir(home / "backends" / "other"), prefix="gen-", host="127.0.0.1")
    try:
        assert gone(pid)
        assert other.prestarted is None and other.memo is not None
        assert not list((home / "backends" / "demo").glob("gen-*"))
    finally:
        os.close(other.owner_fd)


@pytest.mark.parametrize("change", ["script", "memo_mode", "malformed", "memory", None])
def test_nothing_is_started_from_a_memo_it_cannot_trust(home: Path, script: Path, change: str | None) -> None:
    start(home, script).process.stop()
    path = home / "launches" / "v1.json"
    if change == "script":
        script.write_text(SERVER + "\n# changed\n")
    elif change == "memo_mode":
        path.chmod(0o664)
    elif change == "malformed":
        path.write_text('{"version": 1, "launches": {')
    elif change == "memory":
        data = json.loads(path.read_text())
        for entry in data["launches"].values():
            entry["rss"] = 1 << 60
        path.write_text(json.dumps(data))
    prestart(serve_words(home))
    assert launch.loading() == (1 if change is None else 0)  # None: the control, the memo untouched
    launch.settle()
    assert not list((home / "backends" / "demo").glob("gen-*"))


@pytest.mark.parametrize(
    "words",
    [
        ["run", "demo.gguf", "hi"],
        ["serve", "--model", "other.gguf"],
        ["serve", "--model", "demo.gguf", "--hom", "elsewhere"],
    ],
)
def test_other_commands_start_nothing(home: Path, script: Path, words: list[str]) -> None:
    start(home, script).process.stop()
    prestart([*words, "--home", str(home)] if "--hom" not in words else words)
    assert launch.loading() == 0


def test_nothing_is_started_when_the_listen_address_is_taken(home: Path, script: Path) -> None:
    start(home, script).process.stop()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = taken.getsockname()
        prestart(serve_words(home), listen=address)
        assert launch.loading() == 0
    prestart(serve_words(home), listen=address)  # free again
    assert launch.loading() == 1


def test_a_prestarted_child_dies_with_the_host_killed_before_its_plan(home: Path, script: Path) -> None:
    start(home, script).process.stop()
    code = textwrap.dedent(
        f"""
        import os, signal, sys
        from werk_host.backends import launch
        launch.prestart({serve_words(home)!r}, listen=("127.0.0.1", 0))
        assert launch.loading() == 1
        print("prestarted", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL and "prestarted" in done.stdout, done.stderr
    (run_dir,) = (home / "backends" / "demo").glob("gen-*")
    record = read_record(run_dir)
    assert record is not None
    assert gone(record.pid, timeout=10)


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("4262", [{"$": "port"}]),
        ("127.0.0.1:4262", ["127.0.0.1:", {"$": "port"}]),
        ("/models/m-42621.gguf", ["/models/m-42621.gguf"]),  # digits in a path are not the port
        ("/h/gen-ab/slots", [{"$": "run_dir"}, "/slots"]),  # the run directory before its generation
        ("key=S3cret", ["key=", {"$": "secret"}]),
    ],
)
def test_a_template_names_each_value_and_the_port_only_where_it_stands_alone(text: str, parts: list[object]) -> None:
    values = {"port": "4262", "run_dir": "/h/gen-ab", "generation": "ab", "secret": "S3cret"}
    assert launch._template(text, values) == parts
    assert launch._fill(parts, values) == text


@pytest.mark.parametrize(
    ("words", "kept"),
    [
        (["run", "m.gguf", "hello there"], ["run", "m.gguf"]),
        (["run", "m.gguf", "--seed", "42", "hi"], ["run", "m.gguf", "--seed", "42"]),
        (["run", "m.gguf", "hi", "--max-tokens=8"], ["run", "m.gguf", "--max-tokens=8"]),
        (["run", "m.gguf", "-"], ["run", "m.gguf"]),
        (["run", "m.gguf", "--seed", "42"], ["run", "m.gguf", "--seed", "42"]),  # the prompt on stdin
        (["run", "-v", "m.gguf", "hi"], ["run", "-v", "m.gguf", "hi"]),  # unsure: kept, a miss
    ],
)
def test_werk_run_is_remembered_without_its_prompt(words: list[str], kept: list[str]) -> None:
    assert launch._without_prompt(words) == kept
    assert launch._key(words) == launch._key(kept)  # the key is made of what is kept


def test_the_memo_never_holds_an_api_key_the_command_was_started_with(
    home: Path, script: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "sk-werk-launch-key-0123456789"
    monkeypatch.setenv("WERK_API_KEYS", key)
    start(home, script).process.stop()
    assert key not in (home / "launches" / "v1.json").read_text()
    prestart(serve_words(home))
    assert launch.loading() == 1  # remembered under the key's hash all the same
    monkeypatch.setenv("WERK_API_KEYS", key + "-other")
    prestart(serve_words(home))
    assert launch.loading() == 0  # another environment, another command
