"""Job records under faults (docs/media.md, "Jobs"): a host killed mid-job, a disk that fills
while a job writes its results, and the store's own start-up recovery."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.store.test_store_enospc import fill, small_fs  # noqa: F401 - the tmpfs fixture
from werk_host.protocol.media import JobStatus
from werk_host.store.jobs import RESTARTED, JobStore
from werk_host.testing.api import Api

from .support import KEY_A, fetch, finished, media_host, running

SERVE = textwrap.dedent(
    """
    import json, sys, threading
    from pathlib import Path
    from werk_host.testing.hosts import install_model, make_host, running
    from werk_host.testing.media import MEDIA_BACKEND, ReferenceMediaPlugin
    home = Path(sys.argv[1])
    install_model(home, "pix", backend=MEDIA_BACKEND, params={"step_delay_s": 0.05})
    host = make_host(home, plugin=ReferenceMediaPlugin(), model="pix", api_keys=(sys.argv[2],))
    with running(host) as url:
        print(json.dumps({"url": url}), flush=True)
        threading.Event().wait()
    """
)


def test_a_host_killed_mid_job_marks_it_failed_at_the_next_start_and_keeps_finished_jobs(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", SERVE, str(home), KEY_A], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        api = Api(json.loads(proc.stdout.readline())["url"], KEY_A)
        quick = {"prompt": "kept", "width": 64, "height": 64, "steps": 2, "seed": 4}
        kept = api.post("/werk/v1/jobs", {"kind": "image", "input": quick})[1]["data"]["id"]
        assert finished(api, kept)["status"] == "succeeded"
        code, kept_png, _ = fetch(f"{api.base}/werk/v1/jobs/{kept}/result/image-0.png", KEY_A)
        assert code == 200
        slow = {"prompt": "lost", "width": 64, "height": 64, "steps": 150}
        lost = api.post("/werk/v1/jobs", {"kind": "image", "input": slow})[1]["data"]["id"]
        queued = api.post("/werk/v1/jobs", {"kind": "image", "input": slow})[1]["data"]["id"]
        running(api, lost)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    on_disk = {r.id: r for r in JobStore(home / "jobs").load()}
    assert on_disk[lost].status is JobStatus.RUNNING and on_disk[queued].status is JobStatus.QUEUED
    with media_host(home) as (live, _plugin):
        for job_id in (lost, queued):
            view = live.api.get(f"/werk/v1/jobs/{job_id}")[1]["data"]
            assert view["status"] == "failed" and view["error"]["message"] == RESTARTED
            assert view["results"] == []
        view = live.api.get(f"/werk/v1/jobs/{kept}")[1]["data"]
        assert view["status"] == "succeeded"
        assert fetch(f"{live.url}/werk/v1/jobs/{kept}/result/image-0.png", KEY_A)[1] == kept_png
    # and the failure was written: a store read without any host agrees
    assert {r.id: r.status for r in JobStore(home / "jobs").load()} == {
        kept: JobStatus.SUCCEEDED,
        lost: JobStatus.FAILED,
        queued: JobStatus.FAILED,
    }


def test_a_disk_that_fills_while_a_job_writes_its_results_fails_it_with_nothing_half_written(
    small_fs: Path,  # noqa: F811 - the fixture
) -> None:
    home = small_fs / "home"
    with media_host(home, params={"step_delay_s": 0.02}) as (live, _plugin):
        fields = {"prompt": "big", "width": 512, "height": 512, "steps": 20, "n": 2}
        job_id = live.api.post("/werk/v1/jobs", {"kind": "image", "input": fields})[1]["data"]["id"]
        running(live.api, job_id)
        filler = fill(small_fs)
        view = finished(live.api, job_id)
        assert view["status"] == "failed" and view["error"]["code"] == "resource_exhausted"
        assert view["results"] == []
        job_dir = home / "jobs" / job_id
        assert sorted(p.name for p in job_dir.iterdir()) == ["request.json", "status.json"]
        assert fetch(f"{live.url}/werk/v1/jobs/{job_id}/result/image-0.png", KEY_A)[0] == 404
        # a new job cannot even be recorded while the disk is full: a 429, no directory left
        status, doc = live.api.post(
            "/werk/v1/jobs", {"kind": "image", "input": {"prompt": "x", "width": 64, "height": 64}}
        )
        assert status == 429, doc
        assert sorted(p.name for p in (home / "jobs").iterdir()) == [".lock", job_id]
        filler.unlink()
        again = live.api.post("/werk/v1/jobs", {"kind": "image", "input": {"prompt": "x", "width": 64, "height": 64}})
        assert finished(live.api, again[1]["data"]["id"])["status"] == "succeeded"


def test_recovery_removes_job_directories_without_a_readable_record(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs")
    record = store.create("ab12", "image", "pix", b"{}")
    broken = tmp_path / "jobs" / ("job_" + "0" * 24)
    broken.mkdir()
    (broken / "status.json").write_text("{not json")
    (tmp_path / "jobs" / "stray-file").write_text("left alone")
    again = JobStore(tmp_path / "jobs")
    assert again.recover() == 1  # the queued record, failed
    assert [r.id for r in again.listing(None)] == [record.id]
    assert not broken.exists() and (tmp_path / "jobs" / "stray-file").exists()
    assert again.get("ab12", record.id).status is JobStatus.FAILED
    with pytest.raises(Exception, match="no job"):
        again.get("cd34", record.id)


def test_state_pruning_never_touches_jobs(tmp_path: Path) -> None:
    with media_host(tmp_path / "home") as (live, _plugin):
        job_id = live.api.post("/werk/v1/jobs", {"kind": "image", "input": {"prompt": "x", "width": 64, "height": 64}})[
            1
        ]
        finished(live.api, job_id["data"]["id"])
        status, doc = live.api.post(
            "/werk/v1/states/prune", {"selector": {"kind": "all", "confirm": True}, "dry_run": False}
        )
        assert status == 200, doc
        status, doc = live.api.post(
            "/werk/v1/prompt-caches/prune", {"selector": {"kind": "all", "confirm": True}, "dry_run": False}
        )
        assert status == 200, doc
        assert live.api.get(f"/werk/v1/jobs/{job_id['data']['id']}")[1]["data"]["status"] == "succeeded"
