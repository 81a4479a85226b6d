"""The native job routes and OpenAI's image routes over a real served host (docs/media.md),
against the reference media backend (werk_host/testing/media.py): the official ``openai`` SDK
for images, raw HTTP for jobs, bad input, isolation between keys, cancellation and failures."""

from __future__ import annotations

import base64
import http.client
import io
import threading
import time
from pathlib import Path

import openai
import pytest

from werk_host.errors import REDACTED_MESSAGES, ErrorCode, WerkError
from werk_host.protocol.media import ImageRequest
from werk_host.store.jobs import JobBounds
from werk_host.testing.media import reference_image

from .support import KEY_A, KEY_B, MODEL, fetch, finished, media_host, running


def exact(
    prompt: str, seed: int, *, width: int = 64, height: int = 64, steps: int = 4, **fields: object
) -> ImageRequest:
    """The request the host runs for these fields (the reference backend's defaults filled in)."""
    return ImageRequest.model_validate(
        {
            "prompt": prompt,
            "width": width,
            "height": height,
            "steps": steps,
            "seed": seed,
            "sampler": "Euler a",
            **fields,
        }
    )


def test_openai_images_generate_is_the_backend_s_own_image_and_deterministic(tmp_path: Path) -> None:
    with media_host(tmp_path / "home") as (live, plugin):
        client = openai.OpenAI(base_url=live.url + "/v1", api_key=KEY_A)
        first = client.images.generate(model=MODEL, prompt="a red cube", size="64x64", n=2, extra_body={"seed": 7})
        again = client.images.generate(model=MODEL, prompt="a red cube", size="64x64", n=2, extra_body={"seed": 7})
        images = [base64.b64decode(d.b64_json or "") for d in first.data]
        assert images == [base64.b64decode(d.b64_json or "") for d in again.data]
        assert images == [reference_image(exact("a red cube", 7), 7), reference_image(exact("a red cube", 7), 8)]
        assert images[0] != images[1]
        assert images[0].startswith(b"\x89PNG\r\n\x1a\n")
        other = client.images.generate(model=MODEL, prompt="a red cube", size="64x64", extra_body={"seed": 8})
        assert base64.b64decode(other.data[0].b64_json or "") == images[1]
        assert plugin.adapters[0].runs == 3


def test_openai_images_without_a_seed_draw_one_and_without_a_size_take_the_backend_s_default(tmp_path: Path) -> None:
    with media_host(tmp_path / "home") as (live, _plugin):
        client = openai.OpenAI(base_url=live.url + "/v1", api_key=KEY_A)
        one = client.images.generate(model=MODEL, prompt="a", size="64x64")
        two = client.images.generate(model=MODEL, prompt="a", size="64x64")
        assert one.data[0].b64_json != two.data[0].b64_json  # a fresh seed each time
        status, doc = live.api.post("/v1/images/generations", {"prompt": "a"})
        assert status == 200, doc
        png = base64.b64decode(doc["data"][0]["b64_json"])
        assert int.from_bytes(png[16:20], "big") == 512  # the reference backend's default size


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"prompt": "x", "size": "65x64"}, "multiple of 8"),
        ({"prompt": "x", "size": "4096x4096"}, "2048"),
        ({"prompt": "x", "size": "big"}, "WIDTHxHEIGHT"),
        ({"prompt": "x", "n": 9}, "n must be"),
        ({"prompt": "x", "steps": 151}, "150"),
        ({"prompt": "x", "sampler": "Warp 9"}, "unknown sampler"),
        ({"prompt": "x", "response_format": "url"}, "b64_json"),
        ({"prompt": "x", "frobnicate": 1}, "unknown field"),
        ({"size": "64x64"}, "prompt is required"),
        ({"prompt": "x", "seed": -5}, "seed"),
        ({"prompt": 5}, "prompt"),
    ],
)
def test_bad_openai_image_requests_are_openai_shaped_400s_before_any_work(
    tmp_path: Path, body: dict[str, object], needle: str
) -> None:
    with media_host(tmp_path / "home") as (live, plugin):
        status, doc = live.api.post("/v1/images/generations", body)
        assert status == 400, doc
        assert doc["error"]["type"] == "invalid_request_error"
        assert needle in doc["error"]["message"]
        assert all(a.runs == 0 for a in plugin.adapters)


def test_openai_images_edit_takes_a_multipart_image_and_refuses_a_mask(tmp_path: Path) -> None:
    with media_host(tmp_path / "home") as (live, _plugin):
        client = openai.OpenAI(base_url=live.url + "/v1", api_key=KEY_A)
        init = reference_image(exact("source", 1), 1)
        edited = client.images.edit(
            model=MODEL,
            image=("in.png", io.BytesIO(init), "image/png"),
            prompt="make it blue",
            size="64x64",
            extra_body={"seed": 3, "strength": 0.5},
        )
        want = reference_image(exact("make it blue", 3, init_image=init, strength=0.5), 3)
        assert base64.b64decode(edited.data[0].b64_json or "") == want
        with pytest.raises(openai.BadRequestError) as refused:
            client.images.edit(
                model=MODEL,
                image=("in.png", io.BytesIO(init), "image/png"),
                mask=("m.png", io.BytesIO(init), "image/png"),
                prompt="x",
            )
        assert "mask" in str(refused.value)


def test_a_job_runs_in_the_background_and_its_result_is_the_synchronous_image(tmp_path: Path) -> None:
    with media_host(tmp_path / "home") as (live, _plugin):
        fields = {"prompt": "a tree", "width": 64, "height": 64, "seed": 11, "n": 2}
        status, doc = live.api.post("/werk/v1/jobs", {"kind": "image", "model": MODEL, "input": fields})
        assert status == 202, doc
        job = doc["data"]
        assert job["id"].startswith("job_") and job["status"] in ("queued", "running", "succeeded")
        done = finished(live.api, job["id"])
        assert done["status"] == "succeeded", done
        assert [f["name"] for f in done["results"]] == ["image-0.png", "image-1.png"]
        assert done["info"]["seeds"] == [11, 12]
        assert (
            done["started_unix_ms"] >= done["created_unix_ms"] and done["finished_unix_ms"] >= done["started_unix_ms"]
        )
        code, data, kind = fetch(f"{live.url}/werk/v1/jobs/{job['id']}/result/image-1.png", KEY_A)
        assert (code, kind) == (200, "image/png")
        assert data == reference_image(exact("a tree", 11), 12)
        status, listing = live.api.get("/werk/v1/jobs")
        assert [j["id"] for j in listing["data"]] == [job["id"]]
        stored = tmp_path / "home" / "jobs" / job["id"]
        assert sorted(p.name for p in stored.iterdir()) == ["image-0.png", "image-1.png", "request.json", "status.json"]
        assert oct(stored.stat().st_mode & 0o777) == "0o700"


def test_another_key_never_sees_a_job(tmp_path: Path) -> None:
    with media_host(tmp_path / "home") as (live, _plugin):
        status, doc = live.api.post(
            "/werk/v1/jobs", {"kind": "image", "input": {"prompt": "mine", "width": 64, "height": 64}}
        )
        job_id = doc["data"]["id"]
        finished(live.api, job_id)
        other = live.api.as_key(KEY_B)
        assert other.get(f"/werk/v1/jobs/{job_id}")[0] == 404
        assert other.post(f"/werk/v1/jobs/{job_id}/cancel", {})[0] == 404
        assert fetch(f"{live.url}/werk/v1/jobs/{job_id}/result/image-0.png", KEY_B)[0] == 404
        assert other.get("/werk/v1/jobs")[1]["data"] == []
        assert live.api.as_key(None).get(f"/werk/v1/jobs/{job_id}")[0] == 401
        assert live.api.get("/werk/v1/jobs/job_nothex")[0] == 400


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"kind": "video", "input": {"prompt": "x"}}, "kind"),
        ({"kind": "image", "input": {"prompt": "x", "width": 12}}, "multiple of 8"),
        ({"kind": "image", "input": {"prompt": "x", "sampler": "nope"}}, "unknown sampler"),
        ({"kind": "image", "input": {"prompt": "x", "init_image": "%%%"}}, "base64"),
        ({"kind": "image", "input": {"prompt": "x", "init_image": "QUFB" * 3_000_000}}, "at most"),
        ({"kind": "image", "model": "nope", "input": {"prompt": "x"}}, "not served"),
    ],
)
def test_a_bad_job_is_refused_whole_and_leaves_no_record(tmp_path: Path, body: dict[str, object], needle: str) -> None:
    with media_host(tmp_path / "home") as (live, plugin):
        status, doc = live.api.post("/werk/v1/jobs", body)
        assert 400 <= status < 500, doc
        assert needle in doc["error"]["message"]
        assert live.api.get("/werk/v1/jobs")[1]["data"] == []
        assert [p.name for p in (tmp_path / "home" / "jobs").iterdir()] == [".lock"]
        assert all(a.runs == 0 for a in plugin.adapters)


def test_cancelling_a_running_and_a_queued_job(tmp_path: Path) -> None:
    with media_host(tmp_path / "home", params={"step_delay_s": 0.05}) as (live, _plugin):
        fields = {"prompt": "slow", "width": 64, "height": 64, "steps": 100}
        first = live.api.post("/werk/v1/jobs", {"kind": "image", "input": fields})[1]["data"]["id"]
        second = live.api.post("/werk/v1/jobs", {"kind": "image", "input": fields})[1]["data"]["id"]
        running(live.api, first)
        status, doc = live.api.post(f"/werk/v1/jobs/{second}/cancel", {})
        assert status == 200 and doc["data"]["status"] == "cancelled"
        live.api.post(f"/werk/v1/jobs/{first}/cancel", {})
        ended = finished(live.api, first)
        assert ended["status"] == "cancelled" and ended["results"] == []
        assert finished(live.api, second)["status"] == "cancelled"
        assert fetch(f"{live.url}/werk/v1/jobs/{first}/result/image-0.png", KEY_A)[0] == 404
        # the worker is free again: the next job runs to its end
        quick = live.api.post("/werk/v1/jobs", {"kind": "image", "input": {**fields, "steps": 2}})[1]["data"]["id"]
        assert finished(live.api, quick)["status"] == "succeeded"


def test_a_backend_that_dies_mid_job_fails_that_job_and_the_next_one_succeeds(tmp_path: Path) -> None:
    with media_host(tmp_path / "home") as (live, plugin):
        plugin.fail_after = 2
        fields = {"prompt": "x", "width": 64, "height": 64}
        failed = live.api.post("/werk/v1/jobs", {"kind": "image", "input": fields})[1]["data"]["id"]
        view = finished(live.api, failed)
        assert view["status"] == "failed"
        assert view["error"] == {"code": "unavailable", "message": "the reference worker stopped"}
        ok = live.api.post("/werk/v1/jobs", {"kind": "image", "input": fields})[1]["data"]["id"]
        assert finished(live.api, ok)["status"] == "succeeded"


def test_a_failed_job_shows_a_redacted_error_s_public_message_only(tmp_path: Path) -> None:
    with media_host(tmp_path / "home") as (live, plugin):
        plugin.fail_after = 1
        plugin.failure = WerkError(ErrorCode.INTERNAL, f"worker crashed reading {live.host.config.home}/x.bin")
        fields = {"prompt": "x", "width": 64, "height": 64}
        failed = live.api.post("/werk/v1/jobs", {"kind": "image", "input": fields})[1]["data"]["id"]
        view = finished(live.api, failed)
        assert view["error"] == {"code": "internal", "message": REDACTED_MESSAGES[ErrorCode.INTERNAL]}


def test_the_per_key_job_bounds_are_429s_and_purging_makes_room(tmp_path: Path) -> None:
    with media_host(tmp_path / "home") as (live, _plugin):
        live.host.jobs.store.bounds = JobBounds(max_jobs_per_key=2)
        fields = {"prompt": "x", "width": 64, "height": 64}
        ids = [live.api.post("/werk/v1/jobs", {"kind": "image", "input": fields})[1]["data"]["id"] for _ in range(2)]
        for job_id in ids:
            finished(live.api, job_id)
        status, doc = live.api.post("/werk/v1/jobs", {"kind": "image", "input": fields})
        assert status == 429 and doc["error"]["code"] == "resource_exhausted" and doc["error"]["retryable"]
        # another key has its own bound
        assert live.api.as_key(KEY_B).post("/werk/v1/jobs", {"kind": "image", "input": fields})[0] == 202
        assert live.host.jobs.purge(None, (ids[0],)).removed == 1
        assert live.api.post("/werk/v1/jobs", {"kind": "image", "input": fields})[0] == 202


def test_interrupt_cancels_only_the_caller_s_own_generation(tmp_path: Path) -> None:
    with media_host(tmp_path / "home", params={"step_delay_s": 0.05}) as (live, _plugin):
        answers: list[tuple[int, dict[str, object]]] = []
        body = {"prompt": "slow", "size": "64x64", "steps": 40}
        thread = threading.Thread(target=lambda: answers.append(live.api.post("/v1/images/generations", body)))
        thread.start()
        deadline = time.monotonic() + 10
        principal_a = live.host.auth.authenticate(KEY_A)
        principal_b = live.host.auth.authenticate(KEY_B)
        assert principal_a is not None and principal_b is not None
        while not live.host.media.active(principal_a) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert live.host.media.active(principal_b) == []
        assert live.host.media.interrupt(principal_b) == 0
        assert live.host.media.interrupt(principal_a) == 1
        thread.join(timeout=20)
        assert answers and answers[0][0] == 409


def test_media_routes_refuse_foreign_origins_and_take_multipart_only_on_edits(tmp_path: Path) -> None:
    with media_host(tmp_path / "home") as (live, _plugin):
        port = int(live.url.rsplit(":", 1)[1])

        def post(path: str, **extra: str) -> tuple[int, bytes]:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                conn.request("POST", path, body=form, headers={**headers, **extra})
                answer = conn.getresponse()
                return answer.status, answer.read()
            finally:
                conn.close()

        form = b'--b\r\nContent-Disposition: form-data; name="prompt"\r\n\r\nx\r\n--b--\r\n'
        headers = {
            "Host": "localhost",
            "Authorization": f"Bearer {KEY_A}",
            "Content-Type": "multipart/form-data; boundary=b",
        }
        assert post("/v1/images/generations")[0] == 415
        assert post("/werk/v1/jobs")[0] == 415
        assert post("/v1/images/edits", Origin="https://evil.example")[0] == 403
        status, body = post("/v1/images/edits")
        assert status == 400 and b"image is required" in body


def test_image_requests_hold_the_gate_s_per_key_bound_like_chats(tmp_path: Path) -> None:
    from werk_host.config import ServerLimits

    limits = ServerLimits(inference_per_key=1)
    with media_host(tmp_path / "home", params={"step_delay_s": 0.05}, limits=limits) as (live, _plugin):
        answers: list[int] = []
        body = {"prompt": "slow", "size": "64x64", "steps": 30}
        thread = threading.Thread(target=lambda: answers.append(live.api.post("/v1/images/generations", body)[0]))
        thread.start()
        principal_a = live.host.auth.authenticate(KEY_A)
        assert principal_a is not None
        deadline = time.monotonic() + 10
        while not live.host.media.active(principal_a) and time.monotonic() < deadline:
            time.sleep(0.01)
        status, doc = live.api.post("/v1/images/generations", {**body, "steps": 1})
        assert status == 429 and doc["error"]["code"] == "rate_limit_exceeded", doc
        # another key is not held back by A's bound
        assert live.api.as_key(KEY_B).post("/v1/images/generations", {**body, "steps": 1})[0] == 200
        thread.join(timeout=30)
        assert answers == [200]
