"""The adapter on the real engine and the tiny pipeline: the same request gives the bytes the
worker's generation function gives directly; batches seed image i with seed + i; progress per
step; image-to-image; cancellation and a killed worker leave the next request working; the
pipeline LRU evicts; capabilities follow the worker's evidence; unknown samplers never reach
the worker."""

from __future__ import annotations

import os
import signal
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from werk_diffusers.adapter import DiffusersAdapter
from werk_diffusers.settings import CACHE_SIZE_ENV
from werk_diffusers.testing import direct

from werk_host.plugin import CapabilityId, CapabilityStatus, ErrorCode, ImageRequest, ImageWork, WerkError
from werk_host.testing.markers import covers_hooks

pytestmark = pytest.mark.engine

Make = Callable[..., DiffusersAdapter]
PNG = b"\x89PNG\r\n\x1a\n"


def request(**extra: Any) -> ImageRequest:
    fields: dict[str, Any] = {
        "prompt": "a red cat",
        "width": 64,
        "height": 64,
        "steps": 8,
        "seed": 42,
        "sampler": "Euler a",
        **extra,
    }
    return ImageRequest(**fields)


def run(
    adapter: DiffusersAdapter,
    req: ImageRequest,
    *,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] = lambda: False,
) -> Any:
    return adapter.generate_image(ImageWork(req, progress or (lambda step, steps: None), cancelled))


def size_of(png: bytes) -> tuple[int, int]:
    assert png.startswith(PNG)
    width, height = struct.unpack(">II", png[16:24])
    return width, height


def status(adapter: DiffusersAdapter, cap: CapabilityId) -> CapabilityStatus:
    return adapter.capabilities()[cap].status


@covers_hooks("werk_image_generation", "werk_image_limits")
def test_txt2img_gives_the_direct_bytes_and_reports_every_step(make: Make, engine: str, pipeline: Path) -> None:
    adapter = make(pipeline)
    limits = adapter.image_limits()
    assert limits.default_sampler == "Euler a" and "DPM++ 2M" in limits.samplers and limits.img2img
    assert limits.default_size == 16  # the tiny UNet's sample size 8 times the VAE's factor 2
    steps: list[tuple[int, int]] = []
    result = run(adapter, request(), progress=lambda step, total: steps.append((step, total)))
    assert steps == [(i, 8) for i in range(1, 9)]
    assert result.seeds == [42] and result.info["sampler"] == "Euler a"
    assert result.info["pipeline"] == "StableDiffusionPipeline"
    assert size_of(result.images[0]) == (64, 64)
    body = adapter.request_body(ImageWork(request(), lambda s, t: None, lambda: False))
    assert result.images == direct(engine, pipeline, body)
    assert run(adapter, request()).images == result.images  # the same request, the same bytes


@covers_hooks("werk_image_generation")
def test_a_batch_seeds_image_i_with_seed_plus_i(make: Make, pipeline: Path) -> None:
    adapter = make(pipeline)
    steps: list[tuple[int, int]] = []
    batch = run(adapter, request(n=2, seed=7), progress=lambda step, total: steps.append((step, total)))
    assert batch.seeds == [7, 8] and len(batch.images) == 2 and batch.images[0] != batch.images[1]
    assert steps[-1] == (16, 16)
    assert run(adapter, request(seed=8)).images == [batch.images[1]]


@covers_hooks("werk_image_generation", "werk_capabilities")
def test_img2img_runs_on_the_same_pipeline(make: Make, pipeline: Path) -> None:
    adapter = make(pipeline)
    init = run(adapter, request(width=32, height=32)).images[0]
    steps: list[tuple[int, int]] = []
    result = run(adapter, request(init_image=init, strength=0.5), progress=lambda s, t: steps.append((s, t)))
    assert size_of(result.images[0]) == (64, 64)
    assert result.info["pipeline"] == "StableDiffusionImg2ImgPipeline"
    assert steps and steps[-1] == (4, 4)  # strength 0.5 of 8 steps
    assert status(adapter, CapabilityId.IMAGE_IMG2IMG) is CapabilityStatus.SUPPORTED


@covers_hooks("werk_image_generation")
def test_a_cancelled_generation_is_a_conflict_and_the_next_one_works(make: Make, pipeline: Path) -> None:
    adapter = make(pipeline)
    seen: list[int] = []
    with pytest.raises(WerkError) as caught:
        run(
            adapter, request(steps=60), progress=lambda step, total: seen.append(step), cancelled=lambda: len(seen) >= 3
        )
    assert caught.value.code is ErrorCode.CONFLICT
    assert 3 <= len(seen) < 60
    steps: list[int] = []
    result = run(adapter, request(), progress=lambda step, total: steps.append(step))
    assert steps == list(range(1, 9)) and len(result.images) == 1
    with pytest.raises(WerkError) as before:
        run(adapter, request(), cancelled=lambda: True)
    assert before.value.code is ErrorCode.CONFLICT


@covers_hooks("werk_image_generation", "werk_workers")
def test_a_killed_worker_is_unavailable_and_the_next_request_starts_a_new_one(make: Make, pipeline: Path) -> None:
    adapter = make(pipeline)
    (observed,) = adapter.workers()
    assert observed.pid is not None and observed.state == "running" and observed.slots == 1
    before = adapter.identity()

    def kill(step: int, steps: int) -> None:
        if step == 2:
            os.killpg(observed.pid or 0, signal.SIGKILL)

    with pytest.raises(WerkError) as caught:
        run(adapter, request(steps=60), progress=kill)
    assert caught.value.code is ErrorCode.UNAVAILABLE and caught.value.retryable
    assert "stopped during the generation" in caught.value.message
    assert adapter.workers() == []
    assert len(run(adapter, request()).images) == 1
    assert adapter.identity() != before
    (again,) = adapter.workers()
    assert again.pid != observed.pid


@covers_hooks("werk_capabilities", "werk_workers")
def test_the_pipeline_lru_evicts_the_least_recently_used(
    make: Make, pipeline: Path, other_pipeline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CACHE_SIZE_ENV, raising=False)
    first, second = make(pipeline, "first"), make(other_pipeline, "second")
    assert first.workers()[0].pid == second.workers()[0].pid  # one worker for every model
    for cap in (CapabilityId.MODEL_RESIDENCY, CapabilityId.IMAGE_TXT2IMG, CapabilityId.IMAGE_IMG2IMG):
        assert status(first, cap) is CapabilityStatus.UNAVAILABLE
    a = run(first, request()).images
    assert status(first, CapabilityId.IMAGE_TXT2IMG) is CapabilityStatus.SUPPORTED
    assert status(first, CapabilityId.MODEL_RESIDENCY) is CapabilityStatus.SUPPORTED
    assert status(second, CapabilityId.IMAGE_TXT2IMG) is CapabilityStatus.UNAVAILABLE
    b = run(second, request()).images
    assert a != b  # other weights
    assert [e["identity"] for e in first.loaded_pipelines() or []] == [second.model_identity]
    assert status(first, CapabilityId.MODEL_RESIDENCY) is CapabilityStatus.UNAVAILABLE
    assert status(second, CapabilityId.MODEL_RESIDENCY) is CapabilityStatus.SUPPORTED
    monkeypatch.setenv(CACHE_SIZE_ENV, "2")  # read when the worker starts
    first.restart()
    run(first, request())
    run(second, request())
    loaded = [e["identity"] for e in first.loaded_pipelines() or []]
    assert loaded == [first.model_identity, second.model_identity]
    assert run(first, request()).images == a


@covers_hooks("werk_image_generation", "werk_capabilities")
def test_an_unknown_sampler_never_reaches_the_worker(make: Make, pipeline: Path) -> None:
    adapter = make(pipeline)
    with pytest.raises(WerkError) as caught:
        run(adapter, request(sampler="Karras Nonsense"))
    assert caught.value.code is ErrorCode.INVALID_REQUEST
    assert adapter.loaded_pipelines() == []
    assert status(adapter, CapabilityId.IMAGE_TXT2IMG) is CapabilityStatus.UNAVAILABLE
