"""ComfyUI's routes over a real served host (werk_host/http/comfy.py), against the reference media
backend: the default workflow in API format to a job, polled through ``/history`` and fetched
through ``/view`` byte for byte; malformed graphs refused in ComfyUI's validation shape before
any job; per-key isolation of history, view, queue and interrupt; ``/object_info``; and ``/ws``
refused at once."""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from werk_host.protocol.media import ImageRequest
from werk_host.testing.api import Api
from werk_host.testing.hosts import LiveHost
from werk_host.testing.media import reference_image

from .support import fetch, two_model_host

KEY_A, KEY_B, KEY_C = "sk-a", "sk-b", "sk-c"
#: ComfyUI's default workflow, as "Save (API format)" writes it (small and fast here).
DEFAULT: dict[str, Any] = {
    "3": {
        "class_type": "KSampler",
        "inputs": {
            "seed": 42,
            "steps": 3,
            "cfg": 7.5,
            "sampler_name": "euler",
            "scheduler": "normal",
            "denoise": 1.0,
            "model": ["4", 0],
            "positive": ["6", 0],
            "negative": ["7", 0],
            "latent_image": ["5", 0],
        },
        "_meta": {"title": "KSampler"},
    },
    "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "pix"}},
    "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
    "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a lighthouse at dusk", "clip": ["4", 1]}},
    "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["4", 1]}},
    "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
    "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "lighthouse", "images": ["8", 0]}},
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveHost]:
    """One host for the module: ``pix`` (instant) and ``slow`` (50 ms a step), keys A, B, C."""
    with two_model_host(tmp_path_factory.mktemp("comfy"), (KEY_A, KEY_B, KEY_C)) as (live, _plugin):
        yield live


def workflow(**inputs: dict[str, Any]) -> dict[str, Any]:
    """:data:`DEFAULT` with some nodes' inputs changed (``node_id={input: value}``)."""
    graph = copy.deepcopy(DEFAULT)
    for node_id, changes in inputs.items():
        graph[node_id]["inputs"].update(changes)
    return graph


def raw(live: LiveHost, method: str, path: str, key: str | None, body: object = None) -> tuple[int, bytes, str]:
    """``(status, body bytes, content type)`` of one request."""
    return fetch(live.url + path, key, method=method, body=body)


def submit(api: Api, graph: dict[str, Any]) -> str:
    status, body = api.post("/prompt", {"prompt": graph, "client_id": "test-client"})
    assert status == 200, body
    assert set(body) == {"prompt_id", "number", "node_errors"} and body["node_errors"] == {}
    assert re.fullmatch(r"job_[0-9a-f]{24}", body["prompt_id"])
    prompt_id: str = body["prompt_id"]
    return prompt_id


def history(api: Api, prompt_id: str, timeout: float = 15.0) -> dict[str, Any]:
    """The prompt's history entry, polled until it appears (as a ComfyUI polling client does)."""
    deadline = time.monotonic() + timeout
    while True:
        status, body = api.get(f"/history/{prompt_id}")
        assert status == 200, body
        if body:
            entry: dict[str, Any] = body[prompt_id]
            return entry
        assert time.monotonic() < deadline, f"prompt {prompt_id} never reached the history"
        time.sleep(0.02)


def view(live: LiveHost, image: dict[str, str], key: str = KEY_A) -> tuple[int, bytes, str]:
    query = f"filename={image['filename']}&type={image['type']}&subfolder={image['subfolder']}"
    return raw(live, "GET", f"/view?{query}", key)


def exact(n: int = 1, **fields: Any) -> ImageRequest:
    doc: dict[str, Any] = {
        "prompt": "a lighthouse at dusk",
        "negative_prompt": "blurry",
        "width": 64,
        "height": 64,
        "steps": 3,
        "guidance_scale": 7.5,
        "seed": 42,
        "sampler": "Euler",
        "n": n,
    }
    return ImageRequest.model_validate({**doc, **fields})


def test_the_default_workflow_becomes_a_job_polled_through_history_and_viewed(served: LiveHost) -> None:
    api = served.api
    prompt_id = submit(api, DEFAULT)
    entry = history(api, prompt_id)
    number, echoed_id, prompt, extra, outputs = entry["prompt"]
    assert echoed_id == prompt_id and isinstance(number, int) and outputs == ["9"]
    assert extra == {"client_id": "test-client"} and prompt["3"]["inputs"]["sampler_name"] == "euler"
    assert entry["status"]["status_str"] == "success" and entry["status"]["completed"] is True
    kinds = [m[0] for m in entry["status"]["messages"]]
    assert kinds == ["execution_start", "execution_cached", "execution_success"]
    (image,) = entry["outputs"]["9"]["images"]
    assert image == {"filename": f"lighthouse_{prompt_id}_00001_.png", "subfolder": "", "type": "output"}
    status, data, content_type = view(served, image)
    assert status == 200 and content_type == "image/png"
    assert data == reference_image(exact(), 42)  # the backend's bytes, as if called directly
    # The job is a native one too: progress and results through /werk/v1/jobs.
    status, job = api.get(f"/werk/v1/jobs/{prompt_id}")
    assert status == 200 and job["data"]["status"] == "succeeded" and job["data"]["model"] == "pix"


def test_a_batch_of_two_and_the_same_workflow_twice(served: LiveHost) -> None:
    api = served.api
    graph = workflow(**{"5": {"batch_size": 2}, "3": {"seed": 7, "sampler_name": "euler_ancestral"}})
    first, second = submit(api, graph), submit(api, graph)
    images = []
    for prompt_id in (first, second):
        found = history(api, prompt_id)["outputs"]["9"]["images"]
        assert [i["filename"] for i in found] == [f"lighthouse_{prompt_id}_{i:05}_.png" for i in (1, 2)]
        images.append([view(served, image)[1] for image in found])
    request = exact(2, seed=7, sampler="Euler a")
    assert images[0] == images[1] == [reference_image(request, 7), reference_image(request, 8)]
    _, queued = api.get("/history", max_items=1)
    assert list(queued) == [second]


def test_preview_image_outputs_are_temp_files(served: LiveHost) -> None:
    graph = workflow()
    graph["9"] = {"class_type": "PreviewImage", "inputs": {"images": ["8", 0]}}
    prompt_id = submit(served.api, graph)
    (image,) = history(served.api, prompt_id)["outputs"]["9"]["images"]
    assert image["type"] == "temp" and image["filename"].startswith("ComfyUI_temp_")
    assert view(served, image)[1] == reference_image(exact(), 42)


def _without(node_id: str, name: str) -> dict[str, Any]:
    graph = workflow()
    del graph[node_id]["inputs"][name]
    return graph


def _with_node(node_id: str, node: dict[str, Any], **inputs: dict[str, Any]) -> dict[str, Any]:
    graph = workflow(**inputs)
    graph[node_id] = node
    return graph


NODE_ERRORS = [
    ("missing link", _without("3", "positive"), "3", "required_input_missing", "positive"),
    ("link to a missing node", workflow(**{"3": {"positive": ["99", 0]}}), "3", "bad_linked_input", "positive"),
    ("malformed link", workflow(**{"3": {"model": "pix"}}), "3", "bad_linked_input", "model"),
    ("wrong type", workflow(**{"3": {"positive": ["5", 0]}}), "3", "return_type_mismatch", "positive"),
    ("a cycle", workflow(**{"3": {"latent_image": ["3", 0]}}), "3", "dependency_cycle", "latent_image"),
    ("unknown sampler", workflow(**{"3": {"sampler_name": "nonsense"}}), "3", "value_not_in_list", "sampler_name"),
    ("sampler the backend lacks", workflow(**{"3": {"sampler_name": "dpmpp_2m"}}), "3", "value_not_in_list",
     "sampler_name"),
    ("karras without one", workflow(**{"3": {"scheduler": "karras"}}), "3", "custom_validation_failed", "scheduler"),
    ("unknown scheduler", workflow(**{"3": {"scheduler": "beta"}}), "3", "value_not_in_list", "scheduler"),
    ("width 65", workflow(**{"5": {"width": 65}}), "5", "custom_validation_failed", "width"),
    ("width 4096", workflow(**{"5": {"width": 4096}}), "5", "value_bigger_than_max", "width"),
    ("steps 0", workflow(**{"3": {"steps": 0}}), "3", "value_smaller_than_min", "steps"),
    ("steps 151", workflow(**{"3": {"steps": 151}}), "3", "value_bigger_than_max", "steps"),
    ("steps as text", workflow(**{"3": {"steps": "3"}}), "3", "invalid_input_type", "steps"),
    ("batch of 9", workflow(**{"5": {"batch_size": 9}}), "5", "value_bigger_than_max", "batch_size"),
    ("denoise 0.5", workflow(**{"3": {"denoise": 0.5}}), "3", "custom_validation_failed", "denoise"),
    ("seed + n overflow", workflow(**{"3": {"seed": 2**32 - 1}, "5": {"batch_size": 2}}), "3",
     "custom_validation_failed", "seed"),
    ("unknown checkpoint", workflow(**{"4": {"ckpt_name": "v1-5.safetensors"}}), "4", "value_not_in_list",
     "ckpt_name"),
    ("decoding an empty latent", workflow(**{"8": {"samples": ["5", 0]}}), "8", "custom_validation_failed",
     "samples"),
    ("two checkpoints", _with_node("10", {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "slow"}},
                                   **{"6": {"clip": ["10", 1]}}), "6", "custom_validation_failed", "clip"),
    ("prompt too long", workflow(**{"6": {"text": "x" * 20_000}}), "6", "custom_validation_failed", "text"),
]  # fmt: skip


@pytest.mark.parametrize(("graph", "node_id", "kind", "input_name"), [c[1:] for c in NODE_ERRORS],
                         ids=[c[0] for c in NODE_ERRORS])  # fmt: skip
def test_malformed_graphs_are_node_errors_before_any_job(
    served: LiveHost, graph: dict[str, Any], node_id: str, kind: str, input_name: str
) -> None:
    api = served.api.as_key(KEY_C)
    status, body = api.post("/prompt", {"prompt": graph})
    assert status == 400, body
    assert body["error"]["type"] == "prompt_outputs_failed_validation"
    assert set(body["error"]) == {"type", "message", "details", "extra_info"}
    error = body["node_errors"][node_id]
    assert error["class_type"] == graph[node_id]["class_type"] and error["dependent_outputs"] == ["9"]
    assert [e["type"] for e in error["errors"]] == [kind], error
    assert error["errors"][0]["extra_info"]["input_name"] == input_name
    assert set(error["errors"][0]) == {"type", "message", "details", "extra_info"}
    assert api.get("/werk/v1/jobs")[1]["data"] == []


PROMPT_ERRORS = [
    ("unknown class_type", {"prompt": _with_node("10", {"class_type": "LoraLoader", "inputs": {}})}, "invalid_prompt",
     "node LoraLoader does not exist", "Node ID '#10'"),
    ("img2img nodes", {"prompt": _with_node("10", {"class_type": "LoadImage", "inputs": {"image": "x.png"}})},
     "invalid_prompt", "node LoadImage does not exist", "image-to-image"),
    ("no class_type", {"prompt": _with_node("10", {"inputs": {}})}, "invalid_prompt", "class_type", "Node ID '#10'"),
    ("no outputs", {"prompt": {k: v for k, v in DEFAULT.items() if k != "9"}}, "prompt_no_outputs", "no outputs", ""),
    ("no prompt", {"client_id": "x"}, "no_prompt", "No prompt", ""),
    ("a list body", [DEFAULT], "invalid_prompt", "JSON object", ""),
    ("prompt not an object", {"prompt": [1, 2]}, "invalid_prompt", "JSON object", ""),
    ("queue front", {"prompt": DEFAULT, "front": True}, "invalid_prompt", "first in, first out", ""),
]  # fmt: skip


@pytest.mark.parametrize(("body", "kind", "message", "details"), [c[1:] for c in PROMPT_ERRORS],
                         ids=[c[0] for c in PROMPT_ERRORS])  # fmt: skip
def test_malformed_prompts_are_prompt_errors_before_any_job(
    served: LiveHost, body: object, kind: str, message: str, details: str
) -> None:
    api = served.api.as_key(KEY_C)
    status, answer = api.post("/prompt", body)
    assert status == 400, answer
    assert answer["error"]["type"] == kind and answer["node_errors"] == {}
    assert message in answer["error"]["message"] and details in answer["error"]["details"]
    assert api.get("/werk/v1/jobs")[1]["data"] == []


def test_other_errors_keep_comfys_shape(served: LiveHost) -> None:
    status, data, _ = raw(served, "POST", "/prompt", None, {"prompt": DEFAULT})
    assert status == 401
    body = json.loads(data)
    assert body["error"]["type"] == "unauthorized" and body["node_errors"] == {}
    assert "sk-" not in data.decode()
    status, data, _ = raw(served, "POST", "/prompt", KEY_A)  # no body: not JSON
    assert status == 400 and json.loads(data)["error"]["type"] == "invalid_request"
    status, data, _ = raw(served, "DELETE", "/queue", KEY_A)
    assert status == 405 and "error" in json.loads(data)


def test_view_refuses_anything_but_a_job_image(served: LiveHost) -> None:
    prompt_id = submit(served.api, DEFAULT)
    (image,) = history(served.api, prompt_id)["outputs"]["9"]["images"]
    assert view(served, image)[0] == 200
    for changed in (
        {"filename": "../" + image["filename"]},
        {"filename": image["filename"].replace(".png", ".PNG")},
        {"filename": image["filename"].replace("00001", "00002")},  # no second image
        {"filename": image["filename"].replace("00001", "00000")},
        {"filename": f"lighthouse_job_{'0' * 24}_00001_.png"},  # no such job
        {"subfolder": "lighthouse"},
        {"type": "input"},
    ):
        status, data, _ = view(served, {**image, **changed})
        assert status == 404, changed
        assert json.loads(data)["error"]["type"] == "not_found"


def test_keys_see_and_stop_only_their_own_prompts(served: LiveHost) -> None:
    a, b = served.api, served.api.as_key(KEY_B)
    done = submit(a, DEFAULT)
    (image,) = history(a, done)["outputs"]["9"]["images"]
    slow = workflow(**{"4": {"ckpt_name": "slow"}, "3": {"steps": 150}})
    running, pending = submit(a, slow), submit(a, slow)
    deadline = time.monotonic() + 10
    while a.get(f"/werk/v1/jobs/{running}")[1]["data"]["progress"]["step"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    # Key B sees nothing of A's and stops nothing of A's.
    assert b.get(f"/history/{done}") == (200, {}) and done not in b.get("/history")[1]
    assert view(served, image, KEY_B)[0] == 404
    assert b.get("/queue") == (200, {"queue_running": [], "queue_pending": []})
    assert raw(served, "POST", "/interrupt", KEY_B)[0] == 200
    assert raw(served, "POST", "/queue", KEY_B, {"clear": True})[0] == 200
    assert raw(served, "POST", "/queue", KEY_B, {"delete": [pending]})[0] == 200
    assert b.get("/prompt")[1] == {"exec_info": {"queue_remaining": 0}}
    time.sleep(0.1)
    assert a.get(f"/werk/v1/jobs/{running}")[1]["data"]["status"] == "running"
    assert a.get(f"/werk/v1/jobs/{pending}")[1]["data"]["status"] == "queued"
    # Key A sees its own queue, and nothing in history until a job ends.
    status, queue = a.get("/queue")
    assert [item[1] for item in queue["queue_running"]] == [running]
    assert [item[1] for item in queue["queue_pending"]] == [pending]
    assert queue["queue_running"][0][4] == ["9"] and a.get("/prompt")[1]["exec_info"]["queue_remaining"] == 2
    assert a.get(f"/history/{running}") == (200, {})
    assert raw(served, "POST", "/queue", KEY_A, {"delete": [pending]})[0] == 200
    assert a.get(f"/werk/v1/jobs/{pending}")[1]["data"]["status"] == "cancelled"
    assert raw(served, "POST", "/interrupt", KEY_A, {"prompt_id": running})[0] == 200
    entry = history(a, running)
    assert entry["status"]["status_str"] == "error" and entry["status"]["completed"] is False
    assert entry["status"]["messages"][-1][0] == "execution_interrupted" and entry["outputs"] == {}
    assert a.get(f"/werk/v1/jobs/{running}")[1]["data"]["status"] == "cancelled"
    # POST /history forgets the caller's entries only (the jobs stay).
    assert raw(served, "POST", "/history", KEY_B, {"clear": True})[0] == 200
    assert done in a.get("/history")[1]
    assert raw(served, "POST", "/history", KEY_A, {"delete": [done]})[0] == 200
    assert a.get(f"/history/{done}") == (200, {}) and view(served, image)[0] == 200


def test_object_info_describes_exactly_the_served_nodes(served: LiveHost) -> None:
    status, info = served.api.get("/object_info")
    assert status == 200
    assert set(info) == {
        "CheckpointLoaderSimple", "CLIPTextEncode", "EmptyLatentImage", "KSampler", "VAEDecode", "SaveImage",
        "PreviewImage",
    }  # fmt: skip
    assert info["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"] == [["pix", "slow"]]
    assert info["CheckpointLoaderSimple"]["output"] == ["MODEL", "CLIP", "VAE"]
    ksampler = info["KSampler"]
    assert ksampler["input"]["required"]["sampler_name"] == [["euler", "euler_ancestral", "ddim"]]
    assert ksampler["input"]["required"]["scheduler"] == [["normal"]]
    assert ksampler["input"]["required"]["steps"] == ["INT", {"default": 20, "min": 1, "max": 150}]
    assert ksampler["output"] == ["LATENT"] and ksampler["output_node"] is False
    assert ksampler["category"] == "sampling" and ksampler["name"] == "KSampler"
    assert info["SaveImage"]["output_node"] is True and info["SaveImage"]["output"] == []
    for node in info.values():
        assert {"input", "output", "output_name", "name", "display_name", "category", "output_node"} <= set(node)
    assert served.api.get("/object_info/KSampler") == (200, {"KSampler": ksampler})
    assert served.api.get("/object_info/LoadImage") == (200, {})


def test_system_stats_is_minimal_and_honest(served: LiveHost) -> None:
    status, stats = served.api.get("/system_stats")
    assert status == 200 and stats["devices"] == []
    assert stats["system"]["comfyui_version"] is None and stats["system"]["python_version"]


def test_ws_is_refused_at_once(served: LiveHost) -> None:
    status, data, _ = raw(served, "GET", "/ws?clientId=abc", KEY_A)
    assert status == 501
    body = json.loads(data)
    assert body["error"]["type"] == "unsupported" and "/history/" in body["error"]["message"]
    assert raw(served, "GET", "/ws", None)[0] == 401
    websocket = pytest.importorskip("websocket")
    started = time.monotonic()
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        websocket.create_connection(
            served.url.replace("http://", "ws://") + "/ws?clientId=abc",
            header=[f"Authorization: Bearer {KEY_A}"],
            timeout=5,
        )
    assert refused.value.status_code == 501 and time.monotonic() - started < 5
