"""The conformance suite every media plugin runs against the real HTTP app, with one fixture
(docs/plugin-kit.md, "Testing"; docs/media.md, "Writing a media backend")::

    import pytest
    from werk_host.testing.conformance import ConformanceTarget
    from werk_host.testing.media_conformance import MediaConformance

    class TestMediaConformance(MediaConformance):
        @pytest.fixture(scope="class")
        @classmethod
        def conformance_target(cls) -> ConformanceTarget:
            return ConformanceTarget(entry_point="mine", model=Path("my-pipeline"))

The host is the one the text suite starts (:func:`~werk_host.testing.conformance_target.served_target`:
the plugin loaded through its entry point, alone, one API key). ``IMAGE_SIZE`` and
``IMAGE_STEPS`` (class attributes) keep each generation small. The suite checks, over HTTP:

* the capability ids the plugin declares and reports are :class:`CapabilityId` s, an image id
  among them, and ``media.image.txt2img`` is ``supported`` once a generation has run (evidence);
* ``werk_image_limits``: a non-empty sampler list holding the default sampler, defaults within
  the protocol's bounds;
* text-to-image through ``POST /v1/images/generations``: ``n`` PNGs of the asked size; the same
  request gives the same bytes; image 2 of a batch seeded ``s`` is image 1 of the same request
  seeded ``s + 1`` (the seed contract of ``werk_image_generation``); a new seed, a new image;
* every sampler the plugin lists runs;
* a job (``POST /werk/v1/jobs``) reports progress, succeeds, and its result file is the
  synchronous route's image, byte for byte;
* a job cancelled while it runs ends ``cancelled`` with no result (or, if it had already
  finished, ``succeeded``), and the next job succeeds;
* image-to-image (``POST /v1/images/edits``) works when ``media.image.img2img`` is supported
  and is refused with a 4xx when it is not;
* an unknown sampler is a 400 before any work; no error message carries a path or the key.
"""

from __future__ import annotations

import base64
import json
import re
import struct
import time
import urllib.request
from collections.abc import Iterator
from typing import Any, ClassVar, cast

import pytest

from werk_host import hookspecs
from werk_host.protocol import CapabilityId, CapabilityStatus
from werk_host.protocol.media import MAX_IMAGE_STEPS, ImageLimits
from werk_host.testing.conformance_target import ConformanceHost, ConformanceTarget, served_target

__all__ = ["MediaConformance"]

_PATH = re.compile(r"(?<![\w.])/(?:[\w.-]+/)+[\w.-]+")
_IMAGE_IDS = (CapabilityId.IMAGE_TXT2IMG, CapabilityId.IMAGE_IMG2IMG)


def png_size(data: bytes) -> tuple[int, int]:
    """``(width, height)`` of a PNG (its IHDR), asserting it is one."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


def _call(host: ConformanceHost, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    """``host.call`` (it keeps every error message for the leak check), loosely typed."""
    status, doc = host.call(method, path, body)
    return status, cast(dict[str, Any], doc)


class MediaConformance:
    """Subclass in a media plugin's tests with a class-scoped ``conformance_target`` fixture."""

    IMAGE_SIZE: ClassVar[int] = 64
    IMAGE_STEPS: ClassVar[int] = 2

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_host(
        cls, conformance_target: ConformanceTarget, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[ConformanceHost]:
        with served_target(conformance_target, tmp_path_factory.mktemp("werk-media-conformance") / "home") as host:
            yield host

    # -- helpers ----------------------------------------------------------------------------
    def _images(self, host: ConformanceHost, **fields: Any) -> list[bytes]:
        size = self.IMAGE_SIZE
        body = {"model": host.model_name, "size": f"{size}x{size}", "steps": self.IMAGE_STEPS, **fields}
        status, doc = _call(host, "POST", "/v1/images/generations", body)
        assert status == 200, doc
        return [base64.b64decode(d["b64_json"]) for d in doc["data"]]

    def _limits(self, host: ConformanceHost) -> ImageLimits:
        self._images(host, prompt="limits", seed=1)  # the instance is started
        limits = host.host.fleet.hooks.image_limits(host.adapter)
        assert isinstance(limits, ImageLimits), f"{hookspecs.werk_image_limits.__name__} must answer ImageLimits"
        return limits

    def _job(self, host: ConformanceHost, fields: dict[str, Any], timeout: float = 300.0) -> dict[str, Any]:
        status, doc = _call(host, "POST", "/werk/v1/jobs", {"kind": "image", "model": host.model_name, "input": fields})
        assert status == 202, doc
        job_id = doc["data"]["id"]
        deadline = time.monotonic() + timeout
        seen_progress = False
        while True:
            status, doc = _call(host, "GET", f"/werk/v1/jobs/{job_id}")
            assert status == 200, doc
            view: dict[str, Any] = doc["data"]
            seen_progress = seen_progress or view["progress"]["step"] > 0
            if view["status"] in ("succeeded", "failed", "cancelled"):
                view["seen_progress"] = seen_progress
                return view
            assert time.monotonic() < deadline, f"the job did not finish in {timeout} s: {view}"
            time.sleep(0.02)

    def _fetch(self, host: ConformanceHost, path: str) -> bytes:
        request = urllib.request.Request(host.api.base + path, headers={"Authorization": f"Bearer {host.key}"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            data: bytes = answer.read()
            return data

    # -- ids and limits ------------------------------------------------------------------------
    def test_image_ids_are_declared_reported_and_evidenced(self, conformance_host: ConformanceHost) -> None:
        host = conformance_host
        self._images(host, prompt="evidence", seed=1)  # the instance is started and has run
        plugins = host.host.plugins
        raw = plugins.dispatch(hookspecs.werk_capabilities.__name__, host.adapter) or {}
        assert isinstance(raw, dict), "werk_capabilities must return a mapping"
        unknown = sorted(str(k) for k in raw if k not in set(CapabilityId))
        assert not unknown, f"unknown capability ids reported: {unknown}"
        declared = {
            CapabilityId(c)
            for f in plugins.adapter_factories(host.host.config)
            if f.owner == plugins.owner_of(host.adapter)
            for c in f.capabilities
        }
        assert declared & set(_IMAGE_IDS), "a media plugin declares media.image.* on its AdapterFactory"
        assert not set(raw) - declared, "reported but not declared on the AdapterFactory"
        assert host.statuses()[CapabilityId.IMAGE_TXT2IMG] is CapabilityStatus.SUPPORTED

    def test_image_limits_are_coherent(self, conformance_host: ConformanceHost) -> None:
        limits = self._limits(conformance_host)
        assert limits.samplers and limits.default_sampler in limits.samplers
        assert 1 <= limits.default_steps <= MAX_IMAGE_STEPS
        assert limits.default_size % 8 == 0 and limits.default_size >= 8

    # -- generation ----------------------------------------------------------------------------
    def test_text_to_image_is_deterministic_and_keeps_the_seed_contract(
        self, conformance_host: ConformanceHost
    ) -> None:
        host = conformance_host
        batch = self._images(host, prompt="a small red square", n=2, seed=41)
        assert len(batch) == 2 and all(png_size(i) == (self.IMAGE_SIZE, self.IMAGE_SIZE) for i in batch)
        assert self._images(host, prompt="a small red square", n=2, seed=41) == batch
        assert self._images(host, prompt="a small red square", seed=42) == batch[1:]
        assert self._images(host, prompt="a small red square", seed=43) != batch[1:]

    def test_every_listed_sampler_runs(self, conformance_host: ConformanceHost) -> None:
        for sampler in self._limits(conformance_host).samplers:
            (image,) = self._images(conformance_host, prompt="sampler", seed=5, sampler=sampler)
            assert png_size(image) == (self.IMAGE_SIZE, self.IMAGE_SIZE), sampler

    def test_a_job_reports_progress_and_its_result_is_the_synchronous_image(
        self, conformance_host: ConformanceHost
    ) -> None:
        host = conformance_host
        size, steps = self.IMAGE_SIZE, max(self.IMAGE_STEPS, 4)
        fields = {"prompt": "job", "width": size, "height": size, "steps": steps, "seed": 9}
        view = self._job(host, fields)
        assert view["status"] == "succeeded", view
        assert view["progress"]["step"] == view["progress"]["steps"] > 0
        (name,) = [f["name"] for f in view["results"]]
        data = self._fetch(host, f"/werk/v1/jobs/{view['id']}/result/{name}")
        assert data == self._images(host, prompt="job", seed=9, steps=steps)[0]

    def test_a_cancelled_job_ends_cancelled_and_the_next_one_runs(self, conformance_host: ConformanceHost) -> None:
        host = conformance_host
        size = self.IMAGE_SIZE
        fields = {"prompt": "cancel me", "width": size, "height": size, "steps": MAX_IMAGE_STEPS, "seed": 3}
        status, doc = _call(host, "POST", "/werk/v1/jobs", {"kind": "image", "model": host.model_name, "input": fields})
        assert status == 202, doc
        job_id = doc["data"]["id"]
        deadline = time.monotonic() + 120
        while _call(host, "GET", f"/werk/v1/jobs/{job_id}")[1]["data"]["progress"]["step"] == 0:
            assert time.monotonic() < deadline, "the job never made a step"
            time.sleep(0.01)
        assert _call(host, "POST", f"/werk/v1/jobs/{job_id}/cancel")[0] == 200
        while (view := _call(host, "GET", f"/werk/v1/jobs/{job_id}")[1]["data"])["status"] in ("queued", "running"):
            assert time.monotonic() < deadline, "a cancelled job did not stop"
            time.sleep(0.02)
        assert view["status"] in ("cancelled", "succeeded"), view
        if view["status"] == "cancelled":
            assert view["results"] == []
        after = self._job(host, {**fields, "steps": self.IMAGE_STEPS})
        assert after["status"] == "succeeded", after

    def test_image_to_image_works_exactly_when_it_is_supported(self, conformance_host: ConformanceHost) -> None:
        host = conformance_host
        (init,) = self._images(host, prompt="source", seed=2)
        supported = host.statuses().get(CapabilityId.IMAGE_IMG2IMG) is CapabilityStatus.SUPPORTED
        fields = {"prompt": "edited", "width": self.IMAGE_SIZE, "height": self.IMAGE_SIZE, "seed": 2}
        body = {**fields, "steps": max(self.IMAGE_STEPS, 4), "init_image": base64.b64encode(init).decode()}
        view = self._job(host, {**body, "strength": 0.6}) if supported else None
        if view is not None:
            assert view["status"] == "succeeded", view
            return
        status, doc = _call(host, "POST", "/werk/v1/jobs", {"kind": "image", "model": host.model_name, "input": body})
        assert 400 <= status < 600 and status != 500, doc

    def test_bad_input_is_refused_before_any_work_and_says_nothing_private(
        self, conformance_host: ConformanceHost
    ) -> None:
        host = conformance_host
        for body in (
            {"model": host.model_name, "prompt": "x", "size": "64x64", "sampler": "No Such Sampler"},
            {"model": host.model_name, "prompt": "x", "size": "63x64"},
            {"model": host.model_name, "prompt": "x", "size": "64x64", "steps": MAX_IMAGE_STEPS + 1},
        ):
            status, doc = _call(host, "POST", "/v1/images/generations", body)
            assert status == 400, doc
        for message in host.errors:
            assert not _PATH.search(message), f"an error message carries a path: {message!r}"
            assert host.key not in message
            for path in host.model_paths:
                assert path not in message
        assert json.dumps(host.errors)  # plain strings
