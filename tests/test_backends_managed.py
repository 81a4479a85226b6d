"""werk_host.backends.managed: a managed backend child with its log, readiness wait, stop and cleanup.

Every test runs real processes (``sh``, a Python HTTP server); nothing is mocked.
"""

from __future__ import annotations

import gc
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from werk_host.backends.child import create_run_dir
from werk_host.backends.managed import (
    LOG_TAIL_LINES,
    REDACTED,
    BackendStartupError,
    ManagedProcess,
    free_port,
    http_ready,
    live_children,
    read_log_tail,
)
from werk_host.paths import PrivateDirError, ensure_private_dir
from werk_host.testing.processes import gone

SECRET = "sk-managed-child-secret-0123456789"

#: A small HTTP server: ``GET /health`` answers 503 for ``delay`` seconds after start, then 200.
SERVER = textwrap.dedent(
    """
    import http.server, sys, time
    port, delay, secret = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    started = time.monotonic()
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path == "/health" and time.monotonic() - started >= delay
            self.send_response(200 if ok else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()
        def log_message(self, *args):
            pass
    server = http.server.HTTPServer(("127.0.0.1", port), Handler)
    print(f"listening on {port} with key={secret}", flush=True)
    server.serve_forever()
    """
)


@pytest.fixture
def managed() -> Iterator[Callable[..., ManagedProcess]]:
    """Make :class:`ManagedProcess` objects that are stopped at the end of the test whatever happens."""
    made: list[ManagedProcess] = []

    def make(argv: list[str], **kwargs: object) -> ManagedProcess:
        proc = ManagedProcess(argv, **kwargs)  # type: ignore[arg-type]
        made.append(proc)
        return proc

    yield make
    for proc in made:
        proc.stop(timeout=1.0)


def wait_for_log(proc: ManagedProcess, text: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        tail = proc.log_tail()
        if text in tail:
            return tail
        assert time.monotonic() < deadline, f"{text!r} never appeared in the log: {tail!r}"
        time.sleep(0.02)


# -- helpers ------------------------------------------------------------------------------------


def test_private_dir_is_made_owner_only_and_links_are_refused(tmp_path: Path) -> None:
    made = ensure_private_dir(str(tmp_path / "new" / "dir"))
    assert isinstance(made, Path) and stat.S_IMODE(made.stat().st_mode) == 0o700
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    assert stat.S_IMODE(ensure_private_dir(loose).stat().st_mode) == 0o700
    link = tmp_path / "link"
    link.symlink_to(loose)
    with pytest.raises(PrivateDirError):
        ensure_private_dir(link)
    plain = tmp_path / "file"
    plain.write_text("x")
    with pytest.raises((PrivateDirError, FileExistsError)):
        ensure_private_dir(plain)


def test_free_port_can_be_bound() -> None:
    import socket

    port = free_port()
    with socket.create_server(("127.0.0.1", port)) as s:
        assert s.getsockname()[1] == port


def test_log_tail_is_bounded_and_redacted(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    log.write_text("".join(f"line {i} key={SECRET}\n" for i in range(20_000)))
    tail = read_log_tail(log, secrets=(SECRET,))
    lines = tail.splitlines()
    assert len(lines) == LOG_TAIL_LINES and lines[-1] == f"line 19999 key={REDACTED}"
    assert SECRET not in tail
    small = read_log_tail(log, 1000, max_bytes=200)
    assert len(small.encode()) <= 200 and small.splitlines()[-1].startswith("line 19999")
    assert read_log_tail(log, 0) == ""
    assert read_log_tail(tmp_path / "missing.log") == ""
    link = tmp_path / "link.log"
    link.symlink_to(log)
    assert read_log_tail(link) == ""  # no symlink is followed


# -- readiness ----------------------------------------------------------------------------------


def test_health_wait_polls_http_until_ready(tmp_path: Path, managed: Callable[..., ManagedProcess]) -> None:
    port = free_port()
    proc = managed(
        [sys.executable, "-c", SERVER, str(port), "0.5", SECRET], log_path=tmp_path / "server.log", secrets=[SECRET]
    )
    assert proc.start() is proc and proc in live_children()
    assert not http_ready("127.0.0.1", port)()  # not listening yet, or 503
    t0 = time.monotonic()
    proc.wait_ready(http_ready("127.0.0.1", port, "/health"), timeout=30)
    assert time.monotonic() - t0 >= 0.3  # the 503 phase was waited out
    assert proc.alive() and proc.returncode is None
    assert not http_ready("127.0.0.1", port, "/other")()
    tail = proc.log_tail()
    assert f"listening on {port} with key={REDACTED}" in tail and SECRET not in tail
    assert stat.S_IMODE(os.stat(tmp_path / "server.log").st_mode) == 0o600
    pid = proc.pid
    assert pid is not None
    rc = proc.stop()
    assert rc == -signal.SIGTERM and gone(pid) and proc not in live_children()
    assert proc.stop() == rc  # idempotent


def test_a_child_that_logs_is_asked_again_at_once(
    tmp_path: Path, managed: Callable[..., ManagedProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the timed polls an hour apart, readiness can only be found through the log: a child
    that writes its "ready" line is asked again within the burst that line starts (a server
    answers a moment after it logs). This child is ready for one second only: the timed poll at
    the deadline would find it gone."""
    import werk_host.backends.managed as managed_module

    monkeypatch.setattr(managed_module, "_POLL_MIN_S", 3600.0)
    monkeypatch.setattr(managed_module, "_POLL_MAX_S", 3600.0)
    marker = tmp_path / "ready"
    script = textwrap.dedent(
        f"""
        import os, sys, time
        time.sleep(0.3)
        print("model loaded", flush=True)
        time.sleep(0.005)  # ready a moment after the line, as llama-server's /health is
        open({str(marker)!r}, "w").close()
        time.sleep(1)
        os.unlink({str(marker)!r})
        time.sleep(60)
        """
    )
    proc = managed([sys.executable, "-c", script], log_path=tmp_path / "child.log")
    proc.start()
    proc.wait_ready(marker.exists, timeout=10)
    assert proc.alive()


def test_health_wait_timeout_stops_child_and_reports_redacted_tail(
    tmp_path: Path, managed: Callable[..., ManagedProcess]
) -> None:
    run_dir, owner_fd = create_run_dir(tmp_path, "gen-timeout")
    proc = managed(
        ["sh", "-c", f"echo starting; echo key={SECRET}; exec sleep 300"],
        log_path=run_dir / "child.log",
        name="fake-server",
        secrets=[SECRET],
        cleanup_dir=run_dir,
        owner_fd=owner_fd,
    ).start()
    pid = proc.pid
    assert pid is not None
    wait_for_log(proc, "starting")
    with pytest.raises(BackendStartupError) as err:
        proc.wait_ready(http_ready("127.0.0.1", free_port()), timeout=0.5)
    assert err.value.reason == "fake-server did not become healthy within 0.5s"
    assert err.value.returncode is None  # it was still running at the timeout
    assert "starting" in err.value.log_tail and f"key={REDACTED}" in err.value.log_tail
    assert SECRET not in str(err.value) and "--- fake-server log (tail) ---" in str(err.value)
    assert err.value.argv == proc.argv
    assert gone(pid) and not proc.alive()
    assert not run_dir.exists()  # the run directory was released with the child
    with pytest.raises(OSError):
        os.fstat(owner_fd)  # and its owner lock


class ChildFailed(BackendStartupError):
    pass


def test_exit_during_startup_raises_the_callers_error_type_with_status(
    tmp_path: Path, managed: Callable[..., ManagedProcess]
) -> None:
    proc = managed(
        ["sh", "-c", "echo 'fatal: no model' >&2; exit 3"],
        log_path=tmp_path / "child.log",
        name="fake-server",
        error_type=ChildFailed,
    ).start()
    t0 = time.monotonic()
    with pytest.raises(ChildFailed) as err:
        proc.wait_ready(lambda: False, timeout=60)
    assert time.monotonic() - t0 < 10
    assert err.value.reason == "fake-server exited with status 3 during startup"
    assert err.value.returncode == 3 and "fatal: no model" in err.value.log_tail
    assert proc.stop() == 3


def test_a_failing_readiness_check_stops_the_child(tmp_path: Path, managed: Callable[..., ManagedProcess]) -> None:
    proc = managed(["sleep", "300"], log_path=tmp_path / "child.log").start()

    def broken() -> bool:
        raise ValueError("probe exploded")

    with pytest.raises(BackendStartupError) as err:
        proc.wait_ready(broken, timeout=30)
    assert "probe exploded" in err.value.reason and isinstance(err.value.__cause__, ValueError)
    assert proc.pid is not None and gone(proc.pid)


def test_a_program_that_cannot_run_is_a_startup_error(tmp_path: Path, managed: Callable[..., ManagedProcess]) -> None:
    cleanup = tmp_path / "run"
    cleanup.mkdir()
    proc = managed([str(tmp_path / "no-such-server")], log_path=tmp_path / "x.log", cleanup_dir=cleanup)
    with pytest.raises(BackendStartupError) as err:
        proc.start()
    assert err.value.reason.startswith("cannot execute ") and err.value.returncode is None
    assert proc.pid is None and not proc.alive() and not cleanup.exists()
    assert proc.stop() is None


# -- stop ---------------------------------------------------------------------------------------


def test_stop_reaps_the_whole_process_group(tmp_path: Path, managed: Callable[..., ManagedProcess]) -> None:
    proc = managed(["sh", "-c", "sleep 300 & echo $!; wait"], log_path=tmp_path / "child.log").start()
    grandchild = _first_line(proc)
    leader = proc.pid
    assert leader is not None
    proc.stop(timeout=5)
    assert gone(leader) and gone(grandchild)


def test_stop_kills_what_outlived_an_exited_leader(tmp_path: Path, managed: Callable[..., ManagedProcess]) -> None:
    proc = managed(["sh", "-c", "sleep 300 & echo $!"], log_path=tmp_path / "child.log").start()
    grandchild = _first_line(proc)
    deadline = time.monotonic() + 10
    while proc.alive():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert proc.returncode == 0 and not gone(grandchild, timeout=0)  # the leader stays unreaped
    assert proc.stop() == 0
    assert gone(grandchild)


def test_stop_escalates_to_sigkill(tmp_path: Path, managed: Callable[..., ManagedProcess]) -> None:
    proc = managed(
        ["sh", "-c", "trap '' TERM; echo ready; while :; do sleep 1; done"], log_path=tmp_path / "child.log"
    ).start()
    wait_for_log(proc, "ready")
    t0 = time.monotonic()
    assert proc.stop(timeout=0.3) == -signal.SIGKILL
    assert time.monotonic() - t0 < 10


def test_an_unstarted_process_releases_its_files_on_stop(tmp_path: Path) -> None:
    run_dir, owner_fd = create_run_dir(tmp_path, "gen-unused")
    proc = ManagedProcess(["true"], log_path=run_dir / "x.log", cleanup_dir=run_dir, owner_fd=owner_fd)
    assert proc.stop() is None and not run_dir.exists()
    with pytest.raises(OSError):
        os.fstat(owner_fd)


def test_a_garbage_collected_process_is_reaped(tmp_path: Path) -> None:
    cleanup = tmp_path / "run"
    cleanup.mkdir()
    proc = ManagedProcess(["sleep", "300"], log_path=cleanup / "x.log", cleanup_dir=cleanup).start()
    pid = proc.pid
    assert pid is not None
    del proc
    gc.collect()
    assert gone(pid) and not cleanup.exists()


def _first_line(proc: ManagedProcess, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while True:
        lines = proc.log_tail().splitlines()
        if lines:
            return int(lines[0])
        assert time.monotonic() < deadline, "the child printed nothing"
        time.sleep(0.02)


# -- signals and exit ---------------------------------------------------------------------------

#: Starts a child that records a graceful SIGTERM in a marker file, prints its pid, then either
#: exits normally ("exit") or sleeps; with "chain" the owner has its own SIGTERM handler first.
OWNER = textwrap.dedent(
    """
    import signal, sys, time
    from pathlib import Path
    from werk_host.backends.managed import ManagedProcess, install_signal_cleanup
    mode, marker, log = sys.argv[1:4]
    # the dispositions a terminal gives, whatever this test was started under (a background
    # job inherits SIGINT ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    if mode == "ignore":
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    if mode == "chain":
        signal.signal(signal.SIGTERM, lambda s, f: print("handled", flush=True))
    assert install_signal_cleanup()
    script = f'trap "echo term >> {marker}; exit 0" TERM; echo up; while :; do sleep 0.1; done'
    child = ManagedProcess(["sh", "-c", script], log_path=log).start()
    while "up" not in Path(log).read_text():
        time.sleep(0.02)
    print(child.pid, flush=True)
    if mode == "exit":
        sys.exit(0)
    while True:
        time.sleep(0.1)
    """
)


def run_owner(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], int, Path]:
    marker = tmp_path / "marker"
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, mode, str(marker), str(tmp_path / "child.log")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=Path(__file__).parent.parent,
    )
    assert owner.stdout is not None
    line = owner.stdout.readline()
    assert line.strip().isdigit(), f"the owner did not start its child: {line!r}"
    return owner, int(line), marker


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_the_owner_stops_its_children_gracefully(tmp_path: Path, sig: signal.Signals) -> None:
    owner, child, marker = run_owner(tmp_path, "default")
    try:
        owner.send_signal(sig)
        rc = owner.wait(timeout=30)
        assert rc != 0  # the owner still dies of the signal (or KeyboardInterrupt)
        assert gone(child)
        assert marker.read_text() == "term\n"  # stopped with SIGTERM before the owner died
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


def test_signal_cleanup_chains_to_the_previous_handler(tmp_path: Path) -> None:
    owner, child, marker = run_owner(tmp_path, "chain")
    try:
        owner.send_signal(signal.SIGTERM)
        assert owner.stdout is not None
        assert owner.stdout.readline().strip() == "handled"
        assert gone(child) and marker.read_text() == "term\n"
        assert owner.poll() is None  # the owner's own handler chose to keep running
    finally:
        owner.kill()
        owner.wait()


def test_an_ignored_signal_stays_ignored(tmp_path: Path) -> None:
    owner, child, marker = run_owner(tmp_path, "ignore")  # started under nohup: SIGHUP ignored
    try:
        owner.send_signal(signal.SIGHUP)
        with pytest.raises(subprocess.TimeoutExpired):
            owner.wait(timeout=1)
        assert owner.poll() is None and not gone(child, timeout=0.5)  # both serve on
        assert not marker.exists()
        owner.send_signal(signal.SIGTERM)
        assert owner.wait(timeout=30) != 0 and gone(child) and marker.read_text() == "term\n"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


def test_children_are_stopped_at_exit(tmp_path: Path) -> None:
    owner, child, marker = run_owner(tmp_path, "exit")
    assert owner.wait(timeout=30) == 0
    assert gone(child) and marker.read_text() == "term\n"


def test_find_executable_order_and_errors(tmp_path: Path) -> None:
    from werk_host.backends.managed import find_executable

    def tool(name: str) -> Path:
        path = tmp_path / name
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
        return path

    option, from_env, on_path = tool("opt"), tool("env"), tool("thing")
    env = {"THING": str(from_env), "PATH": str(tmp_path)}
    kw = {"env_var": "THING", "error": FileNotFoundError}
    assert find_executable("thing", explicit=str(option), env=env, **kw) == option
    assert find_executable("thing", explicit=None, env=env, **kw) == from_env
    assert find_executable("thing", explicit=None, env={"PATH": str(tmp_path)}, **kw) == on_path
    assert find_executable("thing", explicit=None, env={"PATH": str(tmp_path)}, use_path=False, **kw) is None
    (tmp_path / "plain").write_text("data")
    with pytest.raises(FileNotFoundError, match="THING"):
        find_executable("thing", explicit=None, env={"THING": str(tmp_path / "plain")}, **kw)
