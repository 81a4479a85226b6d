"""Hostile bodies on the image, speech and job routes (werk_host.testing.hostile's wrong values
and checks): every reply below 500, in its route family's error shape, with no key, path or
traceback in it, against a served host with the reference media (and speech) backends. The text routes' own
corpus (tests/test_hostile_bodies.py) covers every other compat route."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from werk_host.testing import hostile
from werk_host.testing.hosts import LiveHost

from .support import KEY_A, MODEL, media_host, speech_host

#: (path, family, a valid body, the fields to give wrong values); the A1111 shape
#: ({"error": str, ...}) is checked as Ollama's, Comfy's ({"error": {"type", "message"}}) as OpenAI's.
ROUTES: tuple[tuple[str, hostile.Family, dict[str, Any], str], ...] = (
    (
        "/v1/images/generations",
        "openai",
        {"model": MODEL, "prompt": "x", "size": "64x64", "steps": 1},
        "model prompt size n steps seed sampler guidance_scale negative_prompt response_format strength",
    ),
    (
        "/sdapi/v1/txt2img",
        "ollama",
        {"prompt": "x", "width": 64, "height": 64, "steps": 1},
        "prompt negative_prompt width height steps seed cfg_scale sampler_name batch_size n_iter override_settings "
        "enable_hr alwayson_scripts send_images",
    ),
    (
        "/sdapi/v1/img2img",
        "ollama",
        {"prompt": "x", "width": 64, "height": 64, "steps": 1, "init_images": ["iVBORw0KGgo="]},
        "init_images denoising_strength mask resize_mode",
    ),
    ("/sdapi/v1/options", "ollama", {"sd_model_checkpoint": MODEL}, "sd_model_checkpoint samples_format"),
    ("/prompt", "openai", {"prompt": {}}, "prompt client_id extra_data"),
    (
        "/v1/audio/speech",
        "openai",
        {"model": "voice", "input": "x", "voice": "alloy"},
        "model input voice response_format speed instructions stream_format seed language",
    ),
)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveHost]:
    with media_host(tmp_path_factory.mktemp("media-hostile") / "home") as (served, _plugin):
        yield served


@pytest.fixture(scope="module")
def spoken(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveHost]:
    """A host with speech models (``voice``) beside an image one."""
    with speech_host(tmp_path_factory.mktemp("speech-hostile")) as (served, _speech, _media):
        yield served


def _leaks(live: LiveHost) -> hostile.Leaks:
    return hostile.Leaks(secrets=(KEY_A,), paths=(str(live.host.config.home),), pids=())


def _cases(path: str, family: hostile.Family, template: dict[str, Any], fields: str) -> Iterator[hostile.Case]:
    route = hostile.Route("POST", path, family, template, tuple(fields.split()))
    for name in route.fields:
        for index, value in enumerate(hostile.WRONG_VALUES + hostile.HUGE_NUMBERS):
            body = json.dumps({**template, name: "\x00SLOT\x00"}).replace('"\\u0000SLOT\\u0000"', value)
            yield hostile.Case(f"{path} {name}=#{index}", route, body.encode())
    for index, raw in enumerate((b"", b"[]", b"null", b'"x"', b"{", b'{"prompt": "x"' + b" " * 10, b"\xff\xfe")):
        yield hostile.Case(f"{path} raw #{index}", route, raw, refuse=True)


@pytest.mark.parametrize(("path", "family", "template", "fields"), ROUTES, ids=[r[0] for r in ROUTES])
def test_hostile_bodies_get_typed_client_errors(
    request: pytest.FixtureRequest, path: str, family: hostile.Family, template: dict[str, Any], fields: str
) -> None:
    live: LiveHost = request.getfixturevalue("spoken" if path.startswith("/v1/audio/") else "live")
    leaks = _leaks(live)
    failures: list[str] = []
    for case in _cases(path, family, template, fields):
        reply = hostile.send(live.url, KEY_A, case)
        failures += [f"{case.name}: {p}" for p in hostile.problems(case, reply, leaks)]
    assert not failures, "\n".join(failures[:20])


JOBS: tuple[tuple[dict[str, Any], str], ...] = (
    (
        {"kind": "image", "model": MODEL, "input": {"prompt": "x", "width": 64, "height": 64, "steps": 1}},
        "prompt width height steps seed n sampler init_image strength",
    ),
    (
        {"kind": "speech", "model": "voice", "input": {"input": "x", "voice": "alloy"}},
        "input voice response_format speed instructions seed language",
    ),
)


@pytest.mark.parametrize(("template", "fields"), JOBS, ids=[j[0]["kind"] for j in JOBS])
def test_hostile_job_bodies_get_the_protocol_s_typed_errors(
    request: pytest.FixtureRequest, template: dict[str, Any], fields: str
) -> None:
    live: LiveHost = request.getfixturevalue("spoken" if template["kind"] == "speech" else "live")
    route = hostile.Route("POST", "/werk/v1/jobs", "openai", template, ("kind", "model", "input"))
    failures: list[str] = []
    values = hostile.WRONG_VALUES + hostile.HUGE_NUMBERS
    bodies = [
        json.dumps({**template, name: "\x00S\x00"}).replace('"\\u0000S\\u0000"', v)
        for name in route.fields
        for v in values
    ]
    bodies += [
        json.dumps({**template, "input": {**template["input"], name: "\x00S\x00"}}).replace('"\\u0000S\\u0000"', v)
        for name in fields.split()
        for v in values
    ]
    for index, body in enumerate(bodies):
        case = hostile.Case(f"jobs #{index}", route, body.encode())
        reply = hostile.send(live.url, KEY_A, case)
        if reply.status >= 500:
            failures.append(f"{case.name}: server error {reply.status}: {body[:80]}")
            continue
        if reply.status >= 400:
            error = json.loads(reply.body).get("error", {})
            if not (isinstance(error, dict) and error.get("code") and error.get("message")):
                failures.append(f"{case.name}: not the protocol's error envelope")
            if KEY_A in reply.body.decode() or str(live.host.config.home) in reply.body.decode():
                failures.append(f"{case.name}: a leak")
    assert not failures, "\n".join(failures[:20])


#: POST routes outside the corpus, and why.
NOT_FUZZED = {
    "/v1/images/edits": "multipart, not JSON: tests/media/test_media_routes.py",
    "/sdapi/v1/interrupt": "no body",
    "/interrupt": "no body",
    "/queue": "Comfy's queue edits: tests/media/test_comfy.py",
}


def test_the_media_corpus_covers_every_image_and_speech_route(live: LiveHost) -> None:
    from falcon.inspect import inspect_routes

    posts = {
        route.path
        for route in inspect_routes(live.host.app)
        # A1111's routes answer 405 in its shape for a method they don't serve (_not_allowed).
        if any(m.method == "POST" and m.function_name != "_not_allowed" for m in route.methods)
        and (
            route.path.startswith(("/v1/images/", "/v1/audio/", "/sdapi/"))
            or route.path in ("/prompt", "/interrupt", "/queue")
        )
    }
    assert posts == {path for path, *_ in ROUTES} | set(NOT_FUZZED)
