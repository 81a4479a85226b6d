"""``werk cache list`` / ``werk cache purge`` against a real WERK_HOME and real processes."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from werk_host.cli import cache as cache_cli
from werk_host.store import StateStore

from .helpers import P1, P2, commit, snapshot, state_dir

HOLD_PAYLOAD = """
import sys
from pathlib import Path
from werk_host.store import StateStore
store = StateStore(Path(sys.argv[1]))
with store.open_payload(sys.argv[2], sys.argv[3]) as f:
    f.read(1)
    print("holding", flush=True)
    sys.stdin.readline()
"""

HOLD_LOCK = """
import sys, time
import filelock
with filelock.FileLock(sys.argv[1] + "/.lock"):
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def run_cli(capsys: pytest.CaptureFixture[str], home: Path, *argv: str) -> tuple[int, Any, str]:
    parser = argparse.ArgumentParser(prog="werk")
    cache_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args([*argv, "--home", str(home), "--json"])
    code = args.handler(args)
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if captured.out.strip() else None, captured.err


def test_list_on_empty_home_creates_nothing(capsys: pytest.CaptureFixture[str], werk_home_dir: Path) -> None:
    code, out, _ = run_cli(capsys, werk_home_dir, "cache", "list")
    assert code == 0 and out["runtime_states"] == [] and out["totals"]["entries"] == 0
    code, out, _ = run_cli(capsys, werk_home_dir, "cache", "purge", "--all", "--dry-run")
    assert code == 0 and out["matched"] == 0
    assert list(werk_home_dir.iterdir()) == []


def test_list_and_purge(capsys: pytest.CaptureFixture[str], werk_home_dir: Path, root: Path) -> None:
    store = StateStore(root)
    plain = commit(store, data=b"x" * 1000)
    pinned = commit(store, P2, pinned=True)
    active = commit(store, data=b"in use")
    broken = commit(store)
    (state_dir(root, P1, broken.id) / "metadata.json").write_bytes(b"{}")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_PAYLOAD, str(root), P1, active.id],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"holding\n"
        before = snapshot(werk_home_dir)
        code, out, _ = run_cli(capsys, werk_home_dir, "cache", "list")
        assert code == 0
        entries = {e["id"]: e for e in out["runtime_states"]}
        assert entries[plain.id]["bytes"] == 1000 and entries[plain.id]["disk_bytes"] > 1000
        assert entries[pinned.id]["pinned"] and entries[pinned.id]["principal_prefix"] == P2[:8]
        assert entries[active.id]["active"] and not entries[plain.id]["active"]
        assert entries[broken.id]["invalid"]
        assert out["totals"]["pinned"] == 1 and out["totals"]["active"] == 1
        assert P1 not in json.dumps(out)  # only principal prefixes, never the full principal

        code, out, _ = run_cli(capsys, werk_home_dir, "cache", "purge", "--all", "--dry-run")
        assert code == 0 and out["dry_run"] and out["removed"] == 0
        assert set(out["ids"]) == {plain.id, broken.id}
        assert set(out["skipped_ids"]) == {pinned.id, active.id}
        assert snapshot(werk_home_dir) == before  # list and dry run changed nothing

        code, out, _ = run_cli(capsys, werk_home_dir, "cache", "purge", active.id)
        assert code == 0 and out["removed"] == 0 and out["skipped_active"] == 1
        code, out, _ = run_cli(capsys, werk_home_dir, "cache", "purge", "--all")
        assert code == 0 and out["removed"] == 2 and out["skipped_pinned"] == 1 and out["skipped_active"] == 1
        # broken was quarantined by the previous purge's reconciliation; --all clears the quarantine
        assert {i.split("-")[-1] for i in out["ids"]} == {plain.id, broken.id}
    finally:
        assert holder.stdin is not None
        holder.stdin.write(b"\n")
        holder.stdin.close()
        holder.wait(timeout=30)
    assert store.get(P1, plain.id) is None and store.get(P2, pinned.id) is not None
    assert store.get(P1, active.id) is not None
    code, out, _ = run_cli(capsys, werk_home_dir, "cache", "purge", active.id)
    assert code == 0 and out["removed"] == 1
    code, out, err = run_cli(capsys, werk_home_dir, "cache", "purge", pinned.id)
    assert code == 0 and out["removed"] == 0 and out["skipped_pinned"] == 1
    assert store.get(P2, pinned.id) is not None


def test_purge_of_an_expired_pinned_id(capsys: pytest.CaptureFixture[str], werk_home_dir: Path, root: Path) -> None:
    past = StateStore(root, clock=lambda: 1_000_000_000.0)  # committed long ago with a 60 s TTL
    rec = commit(past, ttl_seconds=60, pinned=True)
    code, out, _ = run_cli(capsys, werk_home_dir, "cache", "list")
    entry = out["runtime_states"][0]
    assert entry["id"] == rec.id and entry["expired"] and entry["pinned"]
    code, out, _ = run_cli(capsys, werk_home_dir, "cache", "purge", rec.id, "--dry-run")
    assert out["ids"] == [rec.id]  # TTL beats pinning: not protected
    code, out, _ = run_cli(capsys, werk_home_dir, "cache", "purge", rec.id)
    assert code == 0 and out["removed"] == 1 and out["ids"] == [rec.id]
    assert not state_dir(root, P1, rec.id).exists()


def test_purge_errors(capsys: pytest.CaptureFixture[str], werk_home_dir: Path, root: Path) -> None:
    commit(StateStore(root))
    code, out, err = run_cli(capsys, werk_home_dir, "cache", "purge", "st_" + "0" * 32)
    assert code == 1 and json.loads(err)["error"]["code"] == "not_found"
    code, out, err = run_cli(capsys, werk_home_dir, "cache", "purge", "st_" + "0" * 32, "--all")
    assert code == 2 and json.loads(err)["error"]["code"] == "invalid_request"
    code, out, err = run_cli(capsys, werk_home_dir, "cache", "purge")
    assert code == 2


def test_purge_waits_for_the_server_lock(capsys: pytest.CaptureFixture[str], werk_home_dir: Path, root: Path) -> None:
    rec = commit(StateStore(root))
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(root), "1.0"], stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
    t0 = time.monotonic()
    code, out, _ = run_cli(capsys, werk_home_dir, "cache", "purge", rec.id)
    waited = time.monotonic() - t0
    holder.wait(timeout=30)
    assert code == 0 and out["removed"] == 1
    assert waited >= 0.5  # it queued behind the other process's lock instead of racing it


def run_text(capsys: pytest.CaptureFixture[str], home: Path, *argv: str) -> tuple[int, str, str]:
    """``werk cache ...`` through the real ``werk`` parser, without ``--json``."""
    from werk_host.cli import main

    code = main([*argv, "--home", str(home)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_list_and_purge_print_text_by_default(
    capsys: pytest.CaptureFixture[str], werk_home_dir: Path, root: Path
) -> None:
    code, out, _ = run_text(capsys, werk_home_dir, "cache", "list")
    assert code == 0 and out.startswith("nothing cached (0 entries, 0 B on disk")
    store = StateStore(root)
    plain = commit(store, data=b"x" * 1000)
    pinned = commit(store, P2, pinned=True)
    code, out, _ = run_text(capsys, werk_home_dir, "cache", "list")
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["ID", "OWNER", "KIND", "MODEL", "SIZE", "MARKS", "TIER"]
    rows = {line.split()[0]: line.split() for line in lines[1:-1]}
    assert rows[plain.id][1:4] == [P1[:8] + "…", "state", "tiny-model"] and rows[plain.id][-2:] == ["-", "disk"]
    assert rows[pinned.id][1] == P2[:8] + "…" and rows[pinned.id][-2:] == ["pinned", "disk"]
    assert lines[-1].startswith("2 entries, ") and "2 states (1 pinned, 0 active" in lines[-1]
    assert P1 not in out  # only principal prefixes, never the full principal

    code, out, _ = run_text(capsys, werk_home_dir, "cache", "purge", "--all", "--dry-run")
    assert code == 0 and out.startswith("would remove 1 runtime state (") and "skipped 1 pinned" in out
    assert "nothing was changed" in out and len(out.splitlines()) == 1
    code, out, _ = run_text(capsys, werk_home_dir, "cache", "purge", "--all")
    assert code == 0 and out.startswith("removed 1 runtime state (") and "skipped 1 pinned" in out
    assert store.get(P1, plain.id) is None and store.get(P2, pinned.id) is not None

    code, out, err = run_text(capsys, werk_home_dir, "cache", "purge", "st_" + "0" * 32)
    assert (code, out) == (1, "")
    assert err == "werk: no runtime-state cache entry with that id (see the ids with: werk cache list)\n"
    code, out, err = run_text(capsys, werk_home_dir, "cache", "purge")
    assert code == 2 and err.startswith("werk: give exactly one of <ID> or --all (werk cache purge ID")
