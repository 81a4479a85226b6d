"""The Qwen3-TTS adapter: one deployment instance of a Qwen3-TTS model folder, served by the
plugin's ONE resident worker (the kit's :class:`~werk_host.plugin.engines.EngineWorker` with
``per_model = False``: every model of the backend shares the worker, which keeps its own
bounded LRU of models keyed by each model's files identity, apart from the generic media
worker's; docs/media.md, "Speech").

What it claims, each from evidence (docs/plugin-kit.md, "Capabilities" and "Engine workers"):
``runtime.model_residency`` and ``media.speech.synthesis`` are ``supported`` while the live
worker answers ``/models`` with this model loaded (its detail names the voices, languages and
formats the loaded model and the engine environment offer), ``unavailable`` otherwise (the next
request loads it); ``media.speech.instructions`` likewise, ``unsupported`` when the loaded model
takes no style prompt; ``media.speech.streaming`` ``unsupported``: the package's generation
returns the waveform at its end, and the worker answers it whole.

``werk_speech_limits`` (:func:`read_model`: ``config.json`` and
``speech_tokenizer/config.json``, the files the package itself reads): the voices are the
model's speakers (``talker_config.spk_id``, lowercased as the package matches them; none for a
VoiceDesign model), the languages ``auto`` and the model's non-dialect
``talker_config.codec_language_id`` names, the sample rate the codec's
``output_sample_rate``; ``instructions`` for VoiceDesign (required: the voice description) and
CustomVoice models except the 0.6B size, whose instruction the package drops; no ``speed``
control (the package has none). The formats are those the live worker's ``/models`` lists
(``wav`` and ``pcm`` always, ``flac`` and ``mp3`` where its libsndfile encodes them), ``mp3``
the default where it is one (OpenAI's default), else ``wav``.

``werk_speech_synthesis`` streams ``POST /speech`` through the kit's
:func:`~werk_host.plugin.streams.run_streamed` (the worker's one seat, progress per talker step,
cancel between steps). A worker that dies during the work is ``unavailable`` (retryable): the
next request starts a new worker. A voice-clone (``base``) model is refused when its instance
is made: the speech route takes no reference audio.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from werk_host.plugin import (
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    ErrorCode,
    HostConfig,
    ModelManifest,
    SpeechLimits,
    SpeechResult,
    SpeechWork,
    WerkError,
    hookimpl,
)
from werk_host.plugin.checkpoints import model_root
from werk_host.plugin.engines import EngineWorker, started
from werk_host.plugin.http import post_json
from werk_host.plugin.pool import WorkerPool, files_identity
from werk_host.plugin.streams import run_streamed

from .settings import PYTHON_ENV, Settings, cache_size, parse_options

__all__ = ["BACKEND_ID", "REPORTED", "ModelInfo", "QwenTtsAdapter", "accepts", "create_adapter", "read_model"]

BACKEND_ID = "qwen-tts"
WORKER = Path(__file__).with_name("worker.py")
#: One resident worker per host (per interpreter and runtime settings); it holds the models.
POOL = WorkerPool(lambda: 1)
REPORTED = (
    CapabilityId.MODEL_RESIDENCY,
    CapabilityId.SPEECH_SYNTHESIS,
    CapabilityId.SPEECH_INSTRUCTIONS,
    CapabilityId.SPEECH_STREAMING,
)
#: The marker of a Qwen3-TTS folder: its speech tokenizer (codec) beside the talker.
SPEECH_TOKENIZER = "speech_tokenizer/config.json"
MODEL_TYPE = "qwen3_tts"
MAX_JSON_BYTES = 1 << 20
_STREAMING = CapabilityReport(
    CapabilityStatus.UNSUPPORTED,
    "the package's generation returns the waveform at its end; the worker answers it whole",
)


@dataclass(frozen=True)
class ModelInfo:
    """What a Qwen3-TTS folder's own configuration says it offers (module docstring)."""

    tts_model_type: str
    speakers: list[str]
    languages: list[str]
    sample_rate: int | None
    instructions: bool


def _small_json(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as source:
            raw = source.read(MAX_JSON_BYTES + 1)
        doc = json.loads(raw) if len(raw) <= MAX_JSON_BYTES else None
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def read_model(directory: Path) -> ModelInfo | None:
    """The folder's :class:`ModelInfo`, or ``None`` when it is not a Qwen3-TTS model."""
    config = _small_json(directory / "config.json")
    if config.get("model_type") != MODEL_TYPE:
        return None
    talker = config.get("talker_config")
    talker = talker if isinstance(talker, dict) else {}
    kind = str(config.get("tts_model_type", ""))
    speakers = talker.get("spk_id") if kind == "custom_voice" else None
    codec_languages = talker.get("codec_language_id")
    languages = ["auto"]
    if isinstance(codec_languages, dict):
        languages += [str(k).lower() for k in codec_languages if "dialect" not in str(k)]
    rate = _small_json(directory / SPEECH_TOKENIZER).get("output_sample_rate")
    size = str(config.get("tts_model_size", ""))
    return ModelInfo(
        tts_model_type=kind,
        speakers=sorted({str(s).lower() for s in speakers}) if isinstance(speakers, dict) else [],
        languages=sorted(set(languages)),
        sample_rate=rate if isinstance(rate, int) and not isinstance(rate, bool) and rate > 0 else None,
        # the package drops a CustomVoice instruction when ``tts_model_size in "0b6"`` (a substring test)
        instructions=kind == "voice_design" or (kind == "custom_voice" and size not in "0b6"),
    )


class QwenTtsAdapter(EngineWorker):
    backend = BACKEND_ID
    label = "Qwen3-TTS"
    python_env = PYTHON_ENV
    key_env = "WERK_QWEN_TTS_WORKER_KEY"
    worker = WORKER
    pool = POOL
    per_model = False

    def __init__(
        self, config: HostConfig, manifest: ModelManifest, settings: Settings, directory: Path, info: ModelInfo
    ) -> None:
        self.settings = settings
        #: The model's key in the worker's LRU: the exact files (docs/media.md, "Speech").
        self.model_identity = files_identity(manifest)
        self.info = info
        super().__init__(
            config,
            manifest,
            directory,
            python=settings.python,
            startup_timeout=settings.startup_timeout,
            runtime=(settings.device, settings.threads),
        )

    def worker_args(self) -> list[str]:
        settings = self.settings
        return ["--device", settings.device, "--threads", str(settings.threads), "--models", str(cache_size())]

    # -- evidence -----------------------------------------------------------------------------
    def worker_models(self) -> dict[str, Any] | None:
        """The live worker's ``/models`` answer; ``None`` when no worker is alive or it does not
        answer. Starts nothing."""
        current = self.slot.started
        if current is None or not current.run.alive():
            return None
        try:
            return post_json(current.pool, "/models", {})
        except WerkError:
            return None

    def formats(self) -> list[str]:
        """The formats the worker encodes (its ``/models``), the worker started when none is alive."""
        answer = self.worker_models()
        if answer is None:
            self.load()
            answer = self.worker_models()
        found = answer.get("formats") if answer is not None else None
        if not isinstance(found, list) or not found:
            raise WerkError(ErrorCode.UNAVAILABLE, "the Qwen3-TTS worker does not answer", retryable=True)
        return [str(f) for f in found]

    @hookimpl(specname="werk_capabilities")
    def capabilities(self) -> dict[CapabilityId, CapabilityReport]:
        answer = self.worker_models()
        loaded = answer.get("loaded") if answer is not None else None
        entries = [e for e in loaded if isinstance(e, dict)] if isinstance(loaded, list) else []
        entry = next((e for e in entries if e.get("identity") == self.model_identity), None)
        if answer is None or entry is None:
            why = "no live Qwen3-TTS worker" if answer is None else "the live worker does not hold this model"
            absent = CapabilityReport(CapabilityStatus.UNAVAILABLE, f"{why}; the next request loads it")
            return {
                CapabilityId.MODEL_RESIDENCY: absent,
                CapabilityId.SPEECH_SYNTHESIS: absent,
                CapabilityId.SPEECH_INSTRUCTIONS: absent,
                CapabilityId.SPEECH_STREAMING: _STREAMING,
            }
        kind = str(entry.get("tts_model_type"))
        voices = ", ".join(str(v) for v in entry.get("speakers") or []) or "none (a voice description)"
        languages = ", ".join(str(v) for v in entry.get("languages") or [])
        formats = ", ".join(str(v) for v in answer.get("formats") or [])
        detail = f"a {kind} model is loaded in the live Qwen3-TTS worker; voices: {voices}; languages: {languages}"
        instructions = (
            CapabilityReport(CapabilityStatus.SUPPORTED, f"the loaded {kind} model takes a style prompt")
            if entry.get("instructions") is True
            else CapabilityReport(CapabilityStatus.UNSUPPORTED, f"the loaded {kind} model takes no style prompt")
        )
        return {
            CapabilityId.MODEL_RESIDENCY: CapabilityReport(CapabilityStatus.SUPPORTED, detail),
            CapabilityId.SPEECH_SYNTHESIS: CapabilityReport(
                CapabilityStatus.SUPPORTED, f"{detail}; formats: {formats}"
            ),
            CapabilityId.SPEECH_INSTRUCTIONS: instructions,
            CapabilityId.SPEECH_STREAMING: _STREAMING,
        }

    # -- speech hooks (docs/plugin-hooks.md) --------------------------------------------------------
    @hookimpl(specname="werk_speech_limits")
    def speech_limits(self) -> SpeechLimits:
        info, formats = self.info, self.formats()
        return SpeechLimits(
            voices=list(info.speakers),
            default_voice=info.speakers[0] if info.speakers else None,
            languages=list(info.languages),
            formats=formats,
            default_format="mp3" if "mp3" in formats else "wav",
            instructions=info.instructions,
            speed=False,
            streaming=False,
            sample_rate=info.sample_rate,
        )

    def request_body(self, work: SpeechWork) -> dict[str, Any]:
        """The worker's ``/speech`` body for ``work`` (invalid_request for what it cannot run)."""
        request = work.request
        if self.info.tts_model_type == "voice_design" and not request.instructions:
            raise WerkError(
                ErrorCode.INVALID_REQUEST,
                f"model {self.manifest.name} designs its voice from instructions: give instructions",
            )
        return {
            "model_dir": str(self.directory),
            "identity": self.model_identity,
            "input": request.input,
            "voice": request.voice,
            "language": request.language,
            "instructions": request.instructions if self.info.instructions else None,
            "format": request.response_format,
            "seed": request.seed,
            "max_new_tokens": None,
        }

    @hookimpl(specname="werk_speech_synthesis")
    def synthesize(self, work: SpeechWork) -> SpeechResult:
        body = self.request_body(work)
        event = run_streamed(
            self.pool,
            self.slot,
            self._start,
            "/speech",
            body,
            label="Qwen3-TTS",
            cancelled=work.cancelled,
            progress=work.progress,
        )
        try:
            audio = base64.b64decode(event["audio"], validate=True)
            info = event.get("info")
            return SpeechResult(
                audio=audio,
                format=str(event["format"]),
                content_type=str(event["content_type"]),
                sample_rate=int(event["sample_rate"]),
                seconds=float(event["seconds"]),
                info=info if isinstance(info, dict) else {},
            )
        except (binascii.Error, KeyError, TypeError, ValueError) as err:
            raise WerkError(
                ErrorCode.UNAVAILABLE, "the Qwen3-TTS worker answered a malformed result", retryable=True
            ) from err


def accepts(manifest: ModelManifest | None) -> bool:
    """A manifest pinned to this backend, or an unpinned Qwen3-TTS folder (``config.json`` with
    ``speech_tokenizer/`` beside it; no other installed backend takes one)."""
    if manifest is None:
        return False
    if manifest.backend is not None:
        return manifest.backend == BACKEND_ID
    root = model_root(manifest, SPEECH_TOKENIZER)
    return root is not None and any(Path(f.path) == root / "config.json" for f in manifest.files)


def create_adapter(config: HostConfig, manifest: ModelManifest | None) -> QwenTtsAdapter:
    if manifest is None:
        raise WerkError(ErrorCode.INVALID_REQUEST, "the qwen-tts backend needs a model")
    directory = model_root(manifest, SPEECH_TOKENIZER)
    info = read_model(directory) if directory is not None else None
    if directory is None or info is None:
        raise WerkError(
            ErrorCode.INVALID_REQUEST,
            f"model {manifest.name} is not a Qwen3-TTS folder (config.json with speech_tokenizer/ beside it)",
        )
    if info.tts_model_type not in ("custom_voice", "voice_design"):
        raise WerkError(
            ErrorCode.INVALID_REQUEST,
            f"model {manifest.name} clones a voice from reference audio, which the speech routes do not take",
        )
    try:
        settings = parse_options(config.backend_options.get(BACKEND_ID, {}))
        cache_size()
    except ValueError as err:
        raise WerkError(ErrorCode.INVALID_REQUEST, f"qwen-tts options: {err}") from err
    return started(QwenTtsAdapter(config, manifest, settings, directory, info))
