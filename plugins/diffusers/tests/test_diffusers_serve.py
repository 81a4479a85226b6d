"""The real engine through every image route of a real ``werk serve``: the tiny pipeline
registered with ``werk models add``, then the OpenAI SDK, the PyPI ``webuiapi`` client
(AUTOMATIC1111), a Comfy workflow over plain HTTP and a native job each give the PNG bytes the
pipeline gives called directly (werk_diffusers.testing.direct); a worker killed mid-job fails
that job and the next one succeeds; the kit's media conformance suite passes."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from werk_diffusers.testing import direct

from werk_host.testing.api import Api
from werk_host.testing.conformance_target import ConformanceTarget
from werk_host.testing.hosts import serve_process
from werk_host.testing.markers import covers_hooks
from werk_host.testing.media_conformance import MediaConformance

pytestmark = pytest.mark.engine

KEY = "sk-diffusers-serve"
MODEL = "tiny-sd"
BODY = {"prompt": "a lighthouse", "negative_prompt": "", "width": 64, "height": 64, "steps": 8}
BODY |= {"guidance_scale": 7.0, "seed": 42, "sampler": "Euler a", "n": 1, "init_image": None, "strength": 0.75}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, engine: str, pipeline: Path) -> Iterator[str]:
    home = tmp_path_factory.mktemp("diffusers-serve") / "home"
    home.mkdir()
    env = {"WERK_HOME": str(home), "WERK_DIFFUSERS_PYTHON": engine}
    added = subprocess.run(
        [sys.executable, "-m", "werk_host", "models", "add", MODEL, str(pipeline)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
        check=False,
    )
    assert added.returncode == 0, added.stderr
    args = ("--model", MODEL, "--backend-option", "diffusers.threads=1")
    with serve_process(home, *args, keys=(KEY,), env={"WERK_DIFFUSERS_PYTHON": engine}) as proc:
        yield proc.url


@pytest.fixture(scope="module")
def expected(engine: str, pipeline: Path) -> list[bytes]:
    return direct(engine, pipeline, {**BODY, "n": 2})


def _get(url: str) -> bytes:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        data: bytes = answer.read()
        return data


def _job(api: Api, fields: dict[str, Any], timeout: float = 180.0) -> dict[str, Any]:
    status, doc = api.post("/werk/v1/jobs", {"kind": "image", "model": MODEL, "input": fields})
    assert status == 202, doc
    deadline = time.monotonic() + timeout
    while True:
        view: dict[str, Any] = api.get(f"/werk/v1/jobs/{doc['data']['id']}")[1]["data"]
        if view["status"] in ("succeeded", "failed", "cancelled"):
            return view
        assert time.monotonic() < deadline, view
        time.sleep(0.05)


@covers_hooks("werk_image_generation", "werk_image_limits")
def test_the_openai_sdk_gets_the_pipeline_s_own_bytes(served: str, expected: list[bytes]) -> None:
    import openai

    client = openai.OpenAI(base_url=served + "/v1", api_key=KEY)
    answer = client.images.generate(
        model=MODEL, prompt=BODY["prompt"], size="64x64", n=2, extra_body={"seed": 42, "steps": 8, "sampler": "Euler a"}
    )
    assert [base64.b64decode(d.b64_json or "") for d in answer.data] == expected


def test_webuiapi_txt2img_gets_the_pipeline_s_own_bytes(served: str, expected: list[bytes]) -> None:
    webuiapi = pytest.importorskip("webuiapi")
    api = webuiapi.WebUIApi(baseurl=served + "/sdapi/v1")
    api.set_auth("user", KEY)
    assert MODEL in api.util_get_model_names()
    result = api.txt2img(
        prompt=BODY["prompt"], width=64, height=64, steps=8, seed=42, sampler_name="Euler a", cfg_scale=7
    )
    assert base64.b64decode(result.json["images"][0]) == expected[0]
    assert json.loads(result.json["info"])["seed"] == 42


def test_a_comfy_workflow_gets_the_pipeline_s_own_bytes(served: str, expected: list[bytes]) -> None:
    api = Api(served, KEY)
    workflow = {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": MODEL}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": BODY["prompt"], "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["4", 1]}},
        "3": {
            "class_type": "KSampler",
            "inputs": {
                "seed": 42,
                "steps": 8,
                "cfg": 7.0,
                "sampler_name": "euler_ancestral",
                "scheduler": "normal",
                "denoise": 1.0,
                "model": ["4", 0],
                "positive": ["6", 0],
                "negative": ["7", 0],
                "latent_image": ["5", 0],
            },
        },
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "werk", "images": ["8", 0]}},
    }
    status, doc = api.post("/prompt", {"prompt": workflow})
    assert status == 200, doc
    prompt_id = doc["prompt_id"]
    deadline = time.monotonic() + 180
    while not (history := api.get(f"/history/{prompt_id}")[1]):
        assert time.monotonic() < deadline, "the prompt never reached the history"
        time.sleep(0.1)
    (image,) = history[prompt_id]["outputs"]["9"]["images"]
    png = _get(f"{served}/view?filename={image['filename']}&type=output&subfolder=")
    assert png == expected[0]


def test_a_job_s_result_is_the_pipeline_s_own_bytes(served: str, expected: list[bytes]) -> None:
    api = Api(served, KEY)
    fields = {k: BODY[k] for k in ("prompt", "width", "height", "steps", "seed", "sampler", "guidance_scale")}
    view = _job(api, {**fields, "n": 2})
    assert view["status"] == "succeeded", view
    assert [_get(f"{served}/werk/v1/jobs/{view['id']}/result/{f['name']}") for f in view["results"]] == expected


def test_a_worker_killed_mid_job_fails_that_job_and_the_next_one_succeeds(served: str, expected: list[bytes]) -> None:
    api = Api(served, KEY)
    fields = {k: BODY[k] for k in ("prompt", "width", "height", "seed", "sampler", "guidance_scale")}
    status, doc = api.post("/werk/v1/jobs", {"kind": "image", "model": MODEL, "input": {**fields, "steps": 150}})
    assert status == 202, doc
    job_id = doc["data"]["id"]
    deadline = time.monotonic() + 120
    while api.get(f"/werk/v1/jobs/{job_id}")[1]["data"]["progress"]["step"] < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    workers = api.get("/werk/v1/observability")[1]["data"]["workers"]
    (pid,) = {w["pid"] for w in workers if w["backend"] == "diffusers"}
    os.killpg(pid, signal.SIGKILL)  # the worker's process group (its pid is the group's id)
    while (view := api.get(f"/werk/v1/jobs/{job_id}")[1]["data"])["status"] == "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert view["status"] == "failed" and view["error"]["code"] == "unavailable", view
    assert str(pid) not in view["error"]["message"]
    again = _job(api, {**fields, "steps": 8})
    assert again["status"] == "succeeded", again
    assert _get(f"{served}/werk/v1/jobs/{again['id']}/result/image-0.png") == expected[0]


class TestDiffusersMediaConformance(MediaConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, engine: str, pipeline: Path) -> ConformanceTarget:
        return ConformanceTarget(
            entry_point="diffusers",
            model=pipeline,
            model_name=MODEL,
            backend_options={"diffusers": {"python": engine, "threads": 1}},
        )
