"""A reference speech backend: the seam's speech hooks in pure Python, for fast host tests and
as the smallest speech adapter a plugin author can read (docs/media.md, "Writing a speech
backend").

:class:`ReferenceSpeechPlugin` offers one factory, backend ``refspeech``, that serves any
manifest pinned to it. Its adapter "synthesizes" 16-bit mono audio at :data:`SAMPLE_RATE` from
a hash of the exact request (input, voice, language, instructions, seed):
:data:`SAMPLES_PER_CHAR` samples per input character, so the duration grows with the input,
the same request gives the same samples and a change to any field gives others, as a real
engine does. It encodes ``wav`` and ``pcm`` (:data:`FORMATS`), has the voices :data:`VOICES`
and languages :data:`LANGUAGES`, takes ``instructions`` and no ``speed``. It works in
:data:`STEPS` steps, reporting progress after each and stopping at the next once cancelled
(``conflict``); ``step_delay_s`` (a manifest param) makes each step last that long, for tests
that cancel or kill mid-job. ``fail_after`` (a plugin attribute) makes the next synthesis fail
after that many steps with ``unavailable``, as a worker that died would.
"""

from __future__ import annotations

import hashlib
import io
import threading
import time
import wave
from dataclasses import dataclass, field

from pydantic import JsonValue

from werk_host import hookimpl
from werk_host.config import HostConfig
from werk_host.errors import ErrorCode, WerkError
from werk_host.models import ModelManifest
from werk_host.protocol.base import CapabilityStatus
from werk_host.protocol.discovery import CapabilityId
from werk_host.protocol.speech import AUDIO_CONTENT_TYPES, SpeechLimits, SpeechRequest, SpeechResult
from werk_host.seam import AdapterFactory, CapabilityReport, SpeechWork

__all__ = [
    "SPEECH_BACKEND",
    "ReferenceSpeechAdapter",
    "ReferenceSpeechPlugin",
    "reference_samples",
    "wav_bytes",
]

SPEECH_BACKEND = "refspeech"
SAMPLE_RATE = 8000
SAMPLES_PER_CHAR = 80
STEPS = 4
VOICES = ("alloy", "Nova")
LANGUAGES = ("auto", "english")
FORMATS = ("wav", "pcm")


def reference_samples(request: SpeechRequest) -> bytes:
    """The reference backend's 16-bit little-endian samples for ``request`` (module docstring)."""
    key = hashlib.sha256()
    for value in (request.input, request.voice, request.language, request.instructions, request.seed):
        key.update(repr(value).encode() + b"\x00")
    size = len(request.input) * SAMPLES_PER_CHAR * 2
    stream = bytearray()
    block = key.digest()
    while len(stream) < size:
        block = hashlib.sha256(block).digest()
        stream += block
    return bytes(stream[:size])


def wav_bytes(pcm: bytes, sample_rate: int) -> bytes:
    """``pcm`` (16-bit little-endian mono samples) as a WAV file."""
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(sample_rate)
        writer.writeframes(pcm)
    return out.getvalue()


@dataclass
class ReferenceSpeechAdapter:
    """One instance of a ``refspeech`` model (module docstring)."""

    plugin: ReferenceSpeechPlugin
    manifest: ModelManifest
    backend: str = SPEECH_BACKEND
    instance_id: str = ""
    generation: int = 0
    runs: int = 0
    closed: bool = False

    def __post_init__(self) -> None:
        self.instance_id = f"{SPEECH_BACKEND}:{self.manifest.name}"

    def identity(self) -> str:
        return f"{self.instance_id}#{self.generation}"

    def close(self) -> None:
        self.closed = True

    @hookimpl(specname="werk_capabilities")
    def capabilities(self) -> dict[CapabilityId, CapabilityReport]:
        here = "the reference synthesizer is in this process"
        return {
            CapabilityId.SPEECH_SYNTHESIS: CapabilityReport(CapabilityStatus.SUPPORTED, here),
            CapabilityId.SPEECH_INSTRUCTIONS: CapabilityReport(CapabilityStatus.SUPPORTED, here),
            CapabilityId.SPEECH_STREAMING: CapabilityReport(CapabilityStatus.UNSUPPORTED, "it answers whole audio"),
        }

    @hookimpl(specname="werk_speech_limits")
    def speech_limits(self) -> SpeechLimits:
        return SpeechLimits(
            voices=list(VOICES),
            default_voice=VOICES[0],
            languages=list(LANGUAGES),
            formats=list(FORMATS),
            default_format="wav",
            instructions=True,
            sample_rate=SAMPLE_RATE,
        )

    @hookimpl(specname="werk_speech_synthesis")
    def synthesize(self, work: SpeechWork) -> SpeechResult:
        request = work.request
        assert request.seed is not None and request.response_format in FORMATS, "the host makes the request exact"
        delay = self.manifest.params.get("step_delay_s", 0)
        with self.plugin.lock:  # one synthesis at a time, as a real worker
            self.runs += 1
            for step in range(1, STEPS + 1):
                if work.cancelled():
                    raise WerkError(ErrorCode.CONFLICT, "cancelled")
                if isinstance(delay, int | float) and delay > 0:
                    time.sleep(delay)
                if self.plugin.fail_after is not None and step > self.plugin.fail_after:
                    self.plugin.fail_after = None
                    self.generation += 1  # "a new worker" for the next request
                    raise WerkError(ErrorCode.UNAVAILABLE, "the reference worker stopped", retryable=True)
                work.progress(step, STEPS)
            pcm = reference_samples(request)
        audio = wav_bytes(pcm, SAMPLE_RATE) if request.response_format == "wav" else pcm
        info: dict[str, JsonValue] = {"voice": request.voice, "engine": "reference"}
        return SpeechResult(
            audio=audio,
            format=request.response_format,
            content_type=AUDIO_CONTENT_TYPES[request.response_format],
            sample_rate=SAMPLE_RATE,
            seconds=len(pcm) / 2 / SAMPLE_RATE,
            info=info,
        )


@dataclass
class ReferenceSpeechPlugin:
    """The plugin object (register it as ``PLUGIN_NAME``)."""

    PLUGIN_NAME: str = SPEECH_BACKEND
    adapters: list[ReferenceSpeechAdapter] = field(default_factory=list)
    fail_after: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def create(self, config: HostConfig, model: ModelManifest | None) -> ReferenceSpeechAdapter:
        if model is None:
            raise WerkError(ErrorCode.INVALID_REQUEST, "the reference speech backend needs a model")
        adapter = ReferenceSpeechAdapter(self, model)
        self.adapters.append(adapter)
        return adapter

    @hookimpl
    def werk_adapter_factories(self, config: HostConfig) -> list[AdapterFactory]:
        return [
            AdapterFactory(
                SPEECH_BACKEND,
                lambda m: m is not None and m.backend == SPEECH_BACKEND,
                self.create,
                "reference speech from a hash of the request (tests)",
                (CapabilityId.SPEECH_SYNTHESIS, CapabilityId.SPEECH_INSTRUCTIONS, CapabilityId.SPEECH_STREAMING),
            )
        ]
