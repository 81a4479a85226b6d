"""The adapter on the real engine and the tiny model: the samples are the package's own, called
directly (werk_qwen_tts.testing.models.direct); the duration grows with the input; every listed
format encodes; progress per talker step; cancellation and a killed worker leave the next
request working; the model LRU evicts; limits and capabilities follow the loaded model."""

from __future__ import annotations

import io
import os
import signal
import threading
import wave
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from werk_qwen_tts.adapter import QwenTtsAdapter, create_adapter, read_model
from werk_qwen_tts.settings import CACHE_SIZE_ENV
from werk_qwen_tts.testing.models import direct, tiny_model

from werk_host.plugin import (
    CapabilityId,
    CapabilityStatus,
    ErrorCode,
    HostConfig,
    SpeechRequest,
    SpeechResult,
    SpeechWork,
    WerkError,
)
from werk_host.plugin.checkpoints import checkpoint_manifest

pytestmark = pytest.mark.engine

Make = Callable[..., QwenTtsAdapter]
SHORT = "Hello world."
LONG = "Hello world. This is a considerably longer sentence, so that the audio must grow with it."


def speak(adapter: QwenTtsAdapter, progress: list[tuple[int, int]] | None = None, **fields: Any) -> SpeechResult:
    request = SpeechRequest(**{"input": SHORT, "voice": "alice", "response_format": "wav", "seed": 7, **fields})
    seen = progress if progress is not None else []
    return adapter.synthesize(SpeechWork(request, lambda k, n: seen.append((k, n)), lambda: False))


def samples(wav: bytes) -> tuple[int, bytes]:
    with wave.open(io.BytesIO(wav)) as reader:
        assert reader.getnchannels() == 1 and reader.getsampwidth() == 2
        return reader.getframerate(), reader.readframes(reader.getnframes())


def test_the_samples_are_the_package_s_own_and_grow_with_the_input(make: Make, engine: str, model: Path) -> None:
    adapter = make(model)
    progress: list[tuple[int, int]] = []
    short = speak(adapter, progress)
    rate, pcm = samples(short.audio)
    expected = direct(engine, model, {"input": SHORT, "voice": "alice", "seed": 7})
    assert rate == expected["sample_rate"] == short.sample_rate == 24000
    assert pcm == expected["pcm"] and len(pcm) > 0
    assert short.seconds == pytest.approx(len(pcm) / 2 / rate)
    # progress lines are throttled by time (worker.PROGRESS_S): the first step always, then rising
    steps = [k for k, _n in progress]
    assert steps and steps[0] == 1 and steps == sorted(set(steps)) and steps[-1] <= progress[0][1]
    assert all(n == progress[0][1] for _k, n in progress)
    assert speak(adapter).audio == short.audio
    assert speak(adapter, seed=8).audio != short.audio
    assert len(samples(speak(adapter, input=LONG).audio)[1]) > len(pcm)


def test_instructions_and_a_language_reach_the_package(make: Make, engine: str, model: Path) -> None:
    adapter = make(model)
    fields = {"input": SHORT, "voice": "bob", "seed": 3, "language": "english", "instructions": "slowly"}
    got = samples(speak(adapter, **fields).audio)[1]
    assert got == direct(engine, model, fields)["pcm"]
    assert got != samples(speak(adapter, **{**fields, "instructions": None}).audio)[1]


def test_every_listed_format_encodes(make: Make, model: Path) -> None:
    adapter = make(model)
    limits = adapter.speech_limits()
    assert {"wav", "pcm"} <= set(limits.formats)
    wav = speak(adapter).audio
    pcm = samples(wav)[1]
    magic = {"wav": b"RIFF", "flac": b"fLaC"}
    for fmt in limits.formats:
        result = speak(adapter, response_format=fmt)
        assert result.format == fmt and result.audio and result.content_type.startswith("audio/"), fmt
        if fmt in magic:
            assert result.audio.startswith(magic[fmt]), fmt
    if "pcm" in limits.formats:
        assert speak(adapter, response_format="pcm").audio == pcm
    if "mp3" in limits.formats:
        mp3 = speak(adapter, response_format="mp3").audio
        assert mp3[:3] == b"ID3" or mp3[0] == 0xFF, mp3[:4]


def test_limits_agree_with_the_loaded_model_and_capabilities_follow_it(make: Make, model: Path) -> None:
    adapter = make(model)
    before = adapter.capabilities()
    assert before[CapabilityId.SPEECH_SYNTHESIS].status is CapabilityStatus.UNAVAILABLE
    assert before[CapabilityId.SPEECH_STREAMING].status is CapabilityStatus.UNSUPPORTED
    speak(adapter)
    answer = adapter.worker_models()
    assert answer is not None
    (entry,) = answer["loaded"]
    limits = adapter.speech_limits()
    assert limits.voices == entry["speakers"] == ["alice", "bob"]
    assert limits.languages == entry["languages"] == ["auto", "chinese", "english"]
    assert limits.sample_rate == entry["sample_rate"] == 24000
    assert limits.instructions is entry["instructions"] is True
    assert limits.formats == answer["formats"] and not limits.speed and not limits.streaming
    assert limits.default_format == ("mp3" if "mp3" in limits.formats else "wav")
    caps = adapter.capabilities()
    assert caps[CapabilityId.SPEECH_SYNTHESIS].status is CapabilityStatus.SUPPORTED
    assert "alice, bob" in caps[CapabilityId.SPEECH_SYNTHESIS].detail
    assert caps[CapabilityId.SPEECH_INSTRUCTIONS].status is CapabilityStatus.SUPPORTED
    assert caps[CapabilityId.MODEL_RESIDENCY].status is CapabilityStatus.SUPPORTED


def test_a_voice_design_model_needs_instructions_and_a_clone_model_is_refused(
    make: Make, engine: str, design_model: Path, config: HostConfig
) -> None:
    adapter = make(design_model, "tiny-design")
    assert adapter.speech_limits().voices == []
    with pytest.raises(WerkError) as caught:
        speak(adapter, voice=None)
    assert caught.value.code is ErrorCode.INVALID_REQUEST and "instructions" in caught.value.message
    fields = {"input": SHORT, "voice": None, "seed": 2, "instructions": "a deep, calm voice"}
    assert samples(speak(adapter, **fields).audio)[1] == direct(engine, design_model, fields)["pcm"]
    base = tiny_model(engine, kind="base")
    assert read_model(base) is not None
    with pytest.raises(WerkError) as caught:
        create_adapter(config, checkpoint_manifest(base, "tiny-clone"))
    assert caught.value.code is ErrorCode.INVALID_REQUEST and "reference audio" in caught.value.message


def test_cancelled_mid_synthesis_stops_and_the_next_request_runs(make: Make, model: Path) -> None:
    adapter = make(model)
    speak(adapter)
    steps: list[int] = []
    request = SpeechRequest(input=LONG * 3, voice="alice", response_format="wav", seed=1)
    work = SpeechWork(request, lambda k, n: steps.append(k), lambda: len(steps) >= 3)
    with pytest.raises(WerkError) as caught:
        adapter.synthesize(work)
    assert caught.value.code is ErrorCode.CONFLICT and 3 <= len(steps) < 50
    assert speak(adapter).audio.startswith(b"RIFF")


def test_a_worker_killed_mid_synthesis_is_unavailable_and_the_next_request_starts_a_new_one(
    make: Make, model: Path
) -> None:
    adapter = make(model)
    first = speak(adapter).audio
    (worker,) = adapter.workers()
    started = threading.Event()

    def progress(k: int, n: int) -> None:
        if k >= 3:
            started.set()

    request = SpeechRequest(input=LONG * 3, voice="alice", response_format="wav", seed=1)
    errors: list[WerkError] = []

    def run() -> None:
        try:
            adapter.synthesize(SpeechWork(request, progress, lambda: False))
        except WerkError as err:
            errors.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    assert started.wait(120)
    os.killpg(worker.pid or 0, signal.SIGKILL)
    thread.join(120)
    (err,) = errors
    assert err.code is ErrorCode.UNAVAILABLE and err.retryable
    assert str(worker.pid) not in err.message
    assert speak(adapter).audio == first
    (again,) = adapter.workers()
    assert again.pid != worker.pid


def test_the_model_lru_keeps_its_bound(
    make: Make, model: Path, design_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_SIZE_ENV, "1")
    custom, design = make(model), make(design_model, "tiny-design")
    speak(custom)
    speak(design, voice=None, instructions="calm")
    answer = custom.worker_models()
    assert answer is not None
    assert [e["identity"] for e in answer["loaded"]] == [design.model_identity]
    assert custom.capabilities()[CapabilityId.SPEECH_SYNTHESIS].status is CapabilityStatus.UNAVAILABLE
    speak(custom)
    answer = custom.worker_models()
    assert answer is not None and [e["identity"] for e in answer["loaded"]] == [custom.model_identity]
