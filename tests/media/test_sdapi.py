"""AUTOMATIC1111's ``/sdapi/v1`` routes over a real served host (werk_host/http/sdapi.py), against
the reference media backend: the PyPI ``webuiapi`` client for the everyday flows, raw HTTP for
bad input (each a 4xx in A1111's error shape, before any work), per-key isolation of the model
selection, progress and interrupt."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import webuiapi

from werk_host.protocol.media import ImageRequest
from werk_host.testing.api import Api
from werk_host.testing.hosts import LiveHost
from werk_host.testing.media import ReferenceMediaPlugin, reference_image

from .support import two_model_host

KEY_A, KEY_B = "sk-a", "sk-b"
SDAPI = "/sdapi/v1"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveHost, ReferenceMediaPlugin]]:
    """One host for the module: ``pix`` (instant) and ``slow`` (50 ms a step), keys A and B."""
    with two_model_host(tmp_path_factory.mktemp("sdapi"), (KEY_A, KEY_B)) as served:
        yield served


def client(live: LiveHost, key: str, *, basic: bool = True) -> webuiapi.WebUIApi:
    api = webuiapi.WebUIApi(baseurl=live.url + SDAPI)
    if basic:
        api.set_auth("user", key)  # A1111's --api-auth: the key is the password
    else:
        api.session.headers["Authorization"] = f"Bearer {key}"
    return api


def runs(plugin: ReferenceMediaPlugin) -> int:
    return sum(adapter.runs for adapter in plugin.adapters)


def exact(prompt: str, seed: int, **fields: Any) -> ImageRequest:
    doc: dict[str, Any] = {"prompt": prompt, "width": 64, "height": 64, "steps": 3, "sampler": "Euler", "seed": seed}
    return ImageRequest.model_validate({**doc, **fields})


def images_of(result: webuiapi.WebUIApiResult) -> list[bytes]:
    return [base64.b64decode(image) for image in result.json["images"]]


def test_txt2img_through_webuiapi_is_the_backend_s_image_and_deterministic(
    served: tuple[LiveHost, ReferenceMediaPlugin],
) -> None:
    live, plugin = served
    api = client(live, KEY_A)
    before = runs(plugin)
    fields: dict[str, Any] = {"prompt": "a red cube", "seed": 1234, "steps": 3, "width": 64, "height": 64}
    first = api.txt2img(**fields, cfg_scale=7.0, sampler_name="Euler", negative_prompt="blur")
    again = api.txt2img(**fields, cfg_scale=7.0, sampler_name="Euler", negative_prompt="blur")
    assert images_of(first) == images_of(again)
    assert images_of(first) == [reference_image(exact("a red cube", 1234, negative_prompt="blur"), 1234)]
    assert first.image.size == (64, 64)
    info = first.info
    assert info["seed"] == 1234 and info["all_seeds"] == [1234]
    assert (info["sampler_name"], info["steps"], info["cfg_scale"]) == ("Euler", 3, 7.0)
    assert (info["width"], info["height"], info["sd_model_name"]) == (64, 64, "pix")
    assert info["negative_prompt"] == "blur" and "Seed: 1234" in info["infotexts"][0]
    assert first.parameters["prompt"] == "a red cube" and first.parameters["seed"] == 1234
    # batch_size x n_iter images, seed + i each; seed -1 draws one
    batch = api.txt2img(**{**fields, "seed": 40}, sampler_name="Euler", batch_size=2, n_iter=2)
    assert batch.info["all_seeds"] == [40, 41, 42, 43]
    assert images_of(batch) == [reference_image(exact("a red cube", 40), 40 + i) for i in range(4)]
    drawn = api.txt2img(prompt="x", seed=-1, steps=1, width=64, height=64)
    assert isinstance(drawn.info["seed"], int) and drawn.info["seed"] >= 0
    assert drawn.info["sampler_name"] == "Euler a"  # webuiapi's default sampler
    assert runs(plugin) == before + 4
    # Bearer works as well as Basic; send_images false answers no images
    status, doc = live.api.post(f"{SDAPI}/txt2img", {"prompt": "x", "steps": 1, "send_images": False, "foo": 1})
    assert status == 200 and doc["images"] == [] and "foo" not in doc["parameters"]
    assert doc["parameters"]["width"] == 512 and json.loads(doc["info"])["width"] == 512  # the backend's default


def test_img2img_through_webuiapi_and_raw(served: tuple[LiveHost, ReferenceMediaPlugin]) -> None:
    live, _plugin = served
    api = client(live, KEY_A, basic=False)
    start = api.txt2img(prompt="base", seed=5, steps=1, width=64, height=64)
    result = api.img2img(
        images=[start.image], prompt="edit", seed=9, steps=2, width=64, height=64, denoising_strength=0.5
    )
    assert len(result.images) == 1 and result.image.size == (64, 64)
    assert result.info["denoising_strength"] == 0.5 and result.info["seed"] == 9
    assert result.parameters["init_images"] is None  # include_init_images false
    png = reference_image(exact("base", 5), 5)
    body = {
        "init_images": ["data:image/png;base64," + base64.b64encode(png).decode()],
        "prompt": "edit",
        "seed": 9,
        "steps": 3,
        "width": 64,
        "height": 64,
        "sampler_name": "DDIM",
        "denoising_strength": 0.5,
        "include_init_images": True,
    }
    status, doc = live.api.post(f"{SDAPI}/img2img", body)
    assert status == 200, doc
    want = reference_image(exact("edit", 9, sampler="DDIM", init_image=png, strength=0.5), 9)
    assert [base64.b64decode(i) for i in doc["images"]] == [want]
    assert doc["parameters"]["init_images"] == body["init_images"]


def test_models_samplers_and_options_per_key(served: tuple[LiveHost, ReferenceMediaPlugin]) -> None:
    live, _plugin = served
    a, b = client(live, KEY_A), client(live, KEY_B, basic=False)
    assert a.util_get_model_names() == ["pix", "slow"]
    for entry in a.get_sd_models():
        assert set(entry) == {"title", "model_name", "hash", "sha256", "filename", "config"}
        assert "/" not in entry["filename"] and "\\" not in entry["filename"]
        assert len(entry["sha256"]) == 64 and entry["hash"] == entry["sha256"][:10]
    assert a.util_get_sampler_names() == ["DDIM", "Euler", "Euler a"]
    assert a.get_samplers()[0] == {"name": "Euler", "aliases": [], "options": {}}
    assert a.get_options()["sd_model_checkpoint"] == "pix" == a.util_get_current_model()
    wrong = a.session.get(live.url + SDAPI + "/txt2img")
    assert (wrong.status_code, wrong.headers["Allow"], wrong.json()["errors"][:4]) == (405, "POST", "405:")
    try:
        a.util_set_model("slow")
        assert a.util_get_current_model() == "slow"
        assert b.util_get_current_model() == "pix"  # another key's selection is its own
        assert a.txt2img(prompt="m", steps=1, width=64, height=64).info["sd_model_name"] == "slow"
        assert b.txt2img(prompt="m", steps=1, width=64, height=64).info["sd_model_name"] == "pix"
        # override_settings picks the model for one request only
        over = b.txt2img(prompt="m", steps=1, width=64, height=64, override_settings={"sd_model_checkpoint": "slow"})
        assert over.info["sd_model_name"] == "slow" and b.util_get_current_model() == "pix"
        assert a.set_options({"sd_model_checkpoint": "pix", "samples_format": "png", "sd_vae": "Automatic"}) is None
        assert a.util_get_current_model() == "pix"
    finally:
        a.set_options({"sd_model_checkpoint": "pix"})


def a1111_error(status: int, doc: dict[str, Any], want_status: int, detail: str) -> None:
    assert status == want_status, doc
    assert set(doc) == {"error", "detail", "body", "errors"}, doc
    assert doc["error"] == "HTTPException" and doc["body"] == ""
    assert detail in doc["detail"], doc
    assert doc["errors"] == f"{want_status}: {doc['detail']}"


BASE: dict[str, Any] = {"prompt": "p", "steps": 1, "width": 64, "height": 64}
INIT = base64.b64encode(reference_image(exact("x", 1), 1)).decode()
BAD: list[tuple[str, str, object, int, str]] = [
    ("txt2img", "POST", {**BASE, "width": 100}, 400, "multiple of 8"),
    ("txt2img", "POST", {**BASE, "width": 4096, "height": 4096}, 400, "width"),
    ("txt2img", "POST", {**BASE, "steps": 151}, 400, "steps"),
    ("txt2img", "POST", {**BASE, "batch_size": 3, "n_iter": 3}, 400, "batch_size x n_iter"),
    ("txt2img", "POST", {**BASE, "batch_size": 0}, 400, "batch_size"),
    ("txt2img", "POST", {**BASE, "sampler_name": "Heun"}, 400, "unknown sampler"),
    ("txt2img", "POST", {**BASE, "enable_hr": True}, 400, "enable_hr"),
    ("txt2img", "POST", {**BASE, "alwayson_scripts": {"ControlNet": {"args": [{}]}}}, 400, "alwayson_scripts"),
    ("txt2img", "POST", {**BASE, "restore_faces": True}, 400, "restore_faces"),
    ("txt2img", "POST", {**BASE, "save_images": True}, 400, "save_images"),
    ("txt2img", "POST", {**BASE, "styles": ["cinematic"]}, 400, "styles"),
    ("txt2img", "POST", {**BASE, "seed": -5}, 400, "seed"),
    ("txt2img", "POST", {**BASE, "prompt": 5}, 400, "prompt"),
    ("txt2img", "POST", {**BASE, "override_settings": {"sd_model_checkpoint": "nope"}}, 404, "not found"),
    ("txt2img", "POST", {**BASE, "override_settings": {"CLIP_stop_at_last_layers": 2}}, 400, "CLIP_stop"),
    ("txt2img", "POST", [1, 2], 400, "JSON object"),
    ("txt2img", "GET", None, 405, "method"),
    ("sd-models", "DELETE", None, 405, "method"),
    ("img2img", "POST", {**BASE, "init_images": [INIT], "mask": INIT}, 400, "inpainting"),
    ("img2img", "POST", BASE, 400, "init_images"),
    ("img2img", "POST", {**BASE, "init_images": ["A" * (12 << 20)]}, 400, "larger than"),
    ("img2img", "POST", {**BASE, "init_images": ["not base64!"]}, 400, "base64"),
    ("img2img", "POST", {**BASE, "init_images": [INIT], "denoising_strength": 0}, 400, "strength"),
    ("options", "POST", {"sd_model_checkpoint": "nope"}, 404, "not found"),
    ("options", "POST", {"samples_format": "jpg"}, 400, "samples_format"),
    ("options", "POST", {"live_previews_enable": True}, 400, "not supported"),
    ("skip", "POST", {}, 404, "no such route"),
    ("sd-vae", "GET", None, 404, "no such route"),
]


@pytest.mark.parametrize(("route", "method", "body", "status", "detail"), BAD, ids=[f"{b[0]}-{b[4]}" for b in BAD])
def test_bad_input_is_a_4xx_in_a1111_s_shape_before_any_work(
    served: tuple[LiveHost, ReferenceMediaPlugin], route: str, method: str, body: object, status: int, detail: str
) -> None:
    live, plugin = served
    before = runs(plugin)
    got, doc = live.api.call(method, f"{SDAPI}/{route}", body)
    a1111_error(got, doc, status, detail)
    assert runs(plugin) == before
    assert live.api.get(f"{SDAPI}/options")[1]["sd_model_checkpoint"] == "pix"  # nothing half-applied


def test_without_a_key_is_401(served: tuple[LiveHost, ReferenceMediaPlugin]) -> None:
    live, _plugin = served
    for path in ("txt2img", "sd-models", "options", "progress"):
        a1111_error(*live.api.as_key(None).get(f"{SDAPI}/{path}"), 401, "API key")
    response = webuiapi.WebUIApi(baseurl=live.url + SDAPI, username="user", password="wrong").session.get(
        live.url + SDAPI + "/sd-models"
    )
    assert response.status_code == 401 and response.headers["WWW-Authenticate"] == "Basic"


def wait_for(check: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
    return found


def test_progress_and_interrupt_see_only_the_caller_s_own_generations(
    served: tuple[LiveHost, ReferenceMediaPlugin],
) -> None:
    live, _plugin = served
    a, b = client(live, KEY_A), client(live, KEY_B)
    idle = a.get_progress()
    assert idle["progress"] == 0 and idle["state"]["job_count"] == 0 and idle["current_image"] is None
    answer: dict[str, Any] = {}
    body = {**BASE, "steps": 100, "override_settings": {"sd_model_checkpoint": "slow"}}

    def generate() -> None:
        answer["status"], answer["doc"] = Api(live.url, KEY_A).post(f"{SDAPI}/txt2img", body)

    thread = threading.Thread(target=generate)
    thread.start()
    try:
        busy = wait_for(lambda: (p := a.get_progress())["state"]["sampling_step"] > 0 and p)
        assert busy["state"]["job_count"] == 1 and busy["state"]["sampling_steps"] == 100
        assert 0.01 < busy["progress"] < 1 and busy["eta_relative"] > 0
        assert b.get_progress()["state"]["job_count"] == 0  # B sees nothing of A's
        assert b.interrupt() == {}
        step = a.get_progress()["state"]["sampling_step"]
        wait_for(lambda: a.get_progress()["state"]["sampling_step"] > step)  # still running
        assert thread.is_alive()
        assert a.interrupt() == {}
        thread.join(timeout=10)
        assert not thread.is_alive()
        a1111_error(answer["status"], answer["doc"], 409, "cancelled")
        after = a.get_progress()
        assert after["state"]["job_count"] == 0 and after["state"]["interrupted"] is True
    finally:
        a.interrupt()
        thread.join(timeout=10)
