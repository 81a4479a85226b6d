"""``werk jobs`` and ``werk cache list`` over job records, beside a serving host and without one
(werk_host/cli/jobs.py, docs/cli.md "werk jobs"), run as the real command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from werk_host.protocol.media import JobStatus
from werk_host.store.jobs import JobStore

from .support import KEY_B, finished, media_host, running


def werk(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "werk_host", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def werk_json(home: Path, *args: str) -> Any:
    done = werk(home, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_werk_jobs_lists_cancels_and_purges_beside_a_serving_host(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with media_host(home, params={"step_delay_s": 0.05}) as (live, _plugin):
        fields = {"prompt": "x", "width": 64, "height": 64, "steps": 2}
        done_id = live.api.post("/werk/v1/jobs", {"kind": "image", "input": fields})[1]["data"]["id"]
        finished(live.api, done_id)
        theirs = live.api.as_key(KEY_B).post("/werk/v1/jobs", {"kind": "image", "input": fields})[1]["data"]["id"]
        finished(live.api.as_key(KEY_B), theirs)
        slow = live.api.post("/werk/v1/jobs", {"kind": "image", "input": {**fields, "steps": 150}})[1]["data"]["id"]
        running(live.api, slow)
        listing = werk(home, "jobs", "list")
        assert listing.returncode == 0, listing.stderr
        assert done_id in listing.stdout and theirs in listing.stdout and "running" in listing.stdout
        assert {j["id"]: j["status"] for j in werk_json(home, "jobs", "list")} == {
            done_id: "succeeded",
            theirs: "succeeded",
            slow: "running",
        }
        cancelled = werk(home, "jobs", "cancel", slow)
        assert cancelled.returncode == 0 and "cancel requested" in cancelled.stdout, cancelled
        assert finished(live.api, slow, timeout=10)["status"] == "cancelled"
        shown = werk_json(home, "jobs", "show", done_id)
        assert shown["status"] == "succeeded" and [f["name"] for f in shown["results"]] == ["image-0.png"]
        cache = werk(home, "cache", "list")
        assert done_id in cache.stdout and "3 jobs" in cache.stdout, cache.stdout
        assert werk_json(home, "jobs", "purge", done_id, "--dry-run")["removed"] == 1
        assert werk_json(home, "jobs", "purge", done_id)["removed"] == 1
        # the serving host forgets it: another key's job and the cancelled one remain
        assert live.api.get(f"/werk/v1/jobs/{done_id}")[0] == 404
        assert [j["id"] for j in live.api.get("/werk/v1/jobs")[1]["data"]] == [slow]
        assert werk(home, "jobs", "show", done_id).returncode == 1
        assert werk(home, "jobs", "show", "nonsense").returncode == 2
        assert werk(home, "jobs", "purge").returncode == 2


def test_werk_jobs_cancel_without_a_server_writes_the_record(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "home" / "jobs")
    record = store.create("ab12", "image", "pix", b"{}")
    done = werk(tmp_path / "home", "jobs", "cancel", record.id)
    assert done.returncode == 0 and "cancelled" in done.stdout, done
    assert {r.id: r.status for r in JobStore(tmp_path / "home" / "jobs").load()} == {record.id: JobStatus.CANCELLED}
    again = werk(tmp_path / "home", "jobs", "cancel", record.id)
    assert "already ended" in again.stdout
