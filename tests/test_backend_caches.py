"""`werk cache` over backend-owned cache directories: sizes, activity, safe purge."""

from __future__ import annotations

import io
import json
import os
from argparse import Namespace
from pathlib import Path

from werk_host.backend_caches import hold_owner_lock, inventory
from werk_host.cli.cache import cmd_list, cmd_purge


def make_entry(home: Path, name: str, size: int) -> Path:
    entry = home / "backends" / "llamacpp" / name
    (entry / "slots").mkdir(parents=True)
    (entry / "slots" / "state.bin").write_bytes(b"x" * size)
    return entry


def test_list_marks_active_entries_and_purge_keeps_them(tmp_path: Path) -> None:
    home = tmp_path / "home"
    live = make_entry(home, "gen-live", 100)
    dead = make_entry(home, "gen-dead", 50)
    os.close(hold_owner_lock(dead))  # an owner that has gone: the kernel released its lock
    fd = hold_owner_lock(live)
    try:
        canary = tmp_path / "canary"
        canary.write_text("keep me")
        (dead / "link").symlink_to(canary)
        out = io.StringIO()
        assert cmd_list(Namespace(home=str(home), json=True), out=out) == 0
        listed = {e["id"]: e for e in json.loads(out.getvalue())["backend_caches"]}
        assert listed["backend:llamacpp/gen-live"]["active"] is True
        assert listed["backend:llamacpp/gen-live"]["bytes"] == 100
        assert listed["backend:llamacpp/gen-dead"]["bytes"] == 50
        preview = io.StringIO()
        assert cmd_purge(Namespace(home=str(home), id=None, purge_all=True, dry_run=True, json=True), out=preview) == 0
        assert [b["id"] for b in json.loads(preview.getvalue())["backend_caches"]] == ["backend:llamacpp/gen-dead"]
        assert dead.exists()
        done = io.StringIO()
        assert cmd_purge(Namespace(home=str(home), id=None, purge_all=True, dry_run=False, json=True), out=done) == 0
        assert not dead.exists() and live.exists()
        assert canary.read_text() == "keep me"  # the planted link was removed, not followed
        err = io.StringIO()
        assert (
            cmd_purge(
                Namespace(home=str(home), id="backend:llamacpp/gen-live", purge_all=False, dry_run=False, json=True),
                out=io.StringIO(),
                err=err,
            )
            == 1
        )
        assert live.exists()
    finally:
        os.close(fd)
    assert [e.active for e in inventory(home)] == [False]
