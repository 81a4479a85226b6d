"""Shared helpers of the media route tests: hosts serving the reference media (and speech)
backends, raw byte requests, and polling a job to its end."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from werk_host.testing.api import Api
from werk_host.testing.hosts import LiveHost, install_model, serving
from werk_host.testing.media import MEDIA_BACKEND, ReferenceMediaPlugin
from werk_host.testing.speech import SPEECH_BACKEND, ReferenceSpeechPlugin

KEY_A, KEY_B = "sk-media-a", "sk-media-b"
MODEL = "pix"


@contextmanager
def media_host(
    home: Path, *, params: Mapping[str, Any] | None = None, plugin: ReferenceMediaPlugin | None = None, **kwargs: Any
) -> Iterator[tuple[LiveHost, ReferenceMediaPlugin]]:
    """A served host whose one model ``pix`` is the reference media backend's, keys A and B."""
    home.mkdir(parents=True, exist_ok=True)
    install_model(home, MODEL, backend=MEDIA_BACKEND, params=dict(params or {}))
    plugin = plugin or ReferenceMediaPlugin()
    with serving(home, plugin=plugin, model=MODEL, api_keys=(KEY_A, KEY_B), **kwargs) as live:
        yield live, plugin


#: Two media instances: ``pix`` (instant, the default) and ``slow`` (50 ms a step).
TWO_MODELS = """
[[instance]]
id = "pix"
model = "pix"
default = true

[[instance]]
id = "slow"
model = "slow"
"""


@contextmanager
def two_model_host(root: Path, keys: tuple[str, ...]) -> Iterator[tuple[LiveHost, ReferenceMediaPlugin]]:
    """A served host with the instances of :data:`TWO_MODELS`, ``keys`` its API keys."""
    home = root / "home"
    home.mkdir(parents=True)
    install_model(home, "pix", backend=MEDIA_BACKEND, params={})
    install_model(home, "slow", backend=MEDIA_BACKEND, params={"step_delay_s": 0.05})
    profile = root / "deployments.toml"
    profile.write_text(TWO_MODELS)
    plugin = ReferenceMediaPlugin()
    with serving(home, plugin=plugin, model="pix", profile=profile, api_keys=keys) as live:
        yield live, plugin


SPEECH_PROFILE = """
[[instance]]
id = "voice"
model = "voice"
default = true

[[instance]]
id = "slowvoice"
model = "slowvoice"

[[instance]]
id = "pix"
model = "pix"
"""


@contextmanager
def speech_host(root: Path) -> Iterator[tuple[LiveHost, ReferenceSpeechPlugin, ReferenceMediaPlugin]]:
    """A served host: speech instances ``voice`` (instant) and ``slowvoice`` (0.1 s a step),
    and the image instance ``pix``; keys A and B."""
    home = root / "home"
    home.mkdir(parents=True)
    install_model(home, "voice", backend=SPEECH_BACKEND, params={})
    install_model(home, "slowvoice", backend=SPEECH_BACKEND, params={"step_delay_s": 0.1})
    install_model(home, "pix", backend=MEDIA_BACKEND, params={})
    profile = root / "deployments.toml"
    profile.write_text(SPEECH_PROFILE)
    speech, media = ReferenceSpeechPlugin(), ReferenceMediaPlugin()
    with serving(
        home, plugin=speech, extra_plugins={MEDIA_BACKEND: media}, profile=profile, api_keys=(KEY_A, KEY_B)
    ) as live:
        yield live, speech, media


def fetch(
    url: str, key: str | None, *, method: str = "GET", body: object = None, headers: Mapping[str, str] | None = None
) -> tuple[int, bytes, str]:
    """``(status, body bytes, content type)`` of one request; ``body``, if given, sent as JSON;
    ``headers`` added."""
    headers = {**(headers or {}), **({"Authorization": f"Bearer {key}"} if key else {})}
    data = None if body is None else json.dumps(body).encode()
    if data is not None:
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read(), answer.headers.get("Content-Type", "")
    except urllib.error.HTTPError as err:
        return err.code, err.read(), err.headers.get("Content-Type", "")


def finished(api: Api, job_id: str, timeout: float = 30.0) -> dict[str, Any]:
    """The job's view once it is terminal."""
    deadline = time.monotonic() + timeout
    while True:
        status, doc = api.get(f"/werk/v1/jobs/{job_id}")
        assert status == 200, doc
        view: dict[str, Any] = doc["data"]
        if view["status"] in ("succeeded", "failed", "cancelled"):
            return view
        assert time.monotonic() < deadline, f"job {job_id} did not finish: {view}"
        time.sleep(0.02)


def running(api: Api, job_id: str, timeout: float = 30.0) -> dict[str, Any]:
    """The job's view once it runs and has made a step."""
    deadline = time.monotonic() + timeout
    while True:
        status, doc = api.get(f"/werk/v1/jobs/{job_id}")
        view: dict[str, Any] = doc["data"]
        if view["status"] == "running" and view["progress"]["step"] > 0:
            return view
        assert view["status"] in ("queued", "running"), view
        assert time.monotonic() < deadline, f"job {job_id} did not start: {view}"
        time.sleep(0.02)
