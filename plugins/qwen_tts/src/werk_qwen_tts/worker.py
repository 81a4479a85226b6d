"""The Qwen3-TTS worker: the ``qwen-tts`` package's ``Qwen3TTSModel`` on torch behind the kit's
small HTTP server on 127.0.0.1, one worker per host for every model of the backend (a bounded
model LRU).

Run by path with the engine virtualenv's interpreter (``scripts/setup-engine-venv.sh qwen-tts``
makes one), never imported by the plugin: it needs only the standard library, ``torch``,
``numpy``, ``qwen_tts`` and (for flac and mp3) ``soundfile``, and nothing of Werk. The server
itself (key check, loopback, bounded reads, the streamed route) is the kit's worker side,
``werk_host/plugin/engine_worker.py``, loaded by the path the adapter passes as ``--kit``::

    <venv>/bin/python worker.py --kit KIT --port P [--device auto|cpu|cuda|cuda:N] [--threads N] [--models N]

Contract:

* ``POST /speech`` ``{"model_dir", "identity", "input", "voice": str|null, "language":
  str|null, "instructions": str|null, "format": "wav"|"pcm"|"flac"|"mp3", "seed": int,
  "max_new_tokens": int|null}`` streams NDJSON lines: ``{"event": "progress", "step": k,
  "steps": N}`` after the first talker step (one 12.5 Hz codec frame) and then at most every
  :data:`PROGRESS_S` (a line per step slows the synthesis measurably); ``k`` counts the steps
  done, N is ``max_new_tokens``, or the model's ``generation_config.json`` value when null, an
  upper bound: the model usually stops earlier. Then ``{"event": "result", "audio": base64, "format", "content_type",
  "sample_rate", "samples", "seconds", "info": {"tts_model_type", "voice", "language",
  "seed"}}``, or ``{"event": "cancelled"}`` once the client went away (the kit sets
  ``cancelled``; the next talker step stops the generation). A bad body, an unknown voice or
  language, a format not in ``/models``' ``formats``, a voice-design request without
  ``instructions`` or any request to a voice-clone (``base``) model is a ``ValueError`` before
  the first line (the kit answers 400).
* The synthesis is :func:`synthesize` (``torch.manual_seed(seed)``, then the package's
  ``generate_custom_voice`` or ``generate_voice_design`` in non-streaming mode with the model's
  own sampling defaults), so the same request gives the same samples; :func:`encode` turns them
  into the response bytes. Tests and benchmarks call both directly.
* ``POST /models`` ``{}`` answers ``{"loaded": [{"identity", "tts_model_type", "speakers",
  "languages", "sample_rate", "instructions"}], "formats": [...]}``, most recently used last,
  outside the generation lock. ``speakers`` / ``languages`` are what the package model reports
  (``[]`` for none); ``instructions`` says whether ``instructions`` reaches the model
  (:func:`takes_instructions`); ``formats`` are the encodings that work here (``wav`` and
  ``pcm`` always; ``flac`` and ``mp3`` when soundfile's libsndfile encodes them, tried at start).
* Models are kept in an LRU keyed by ``identity``, at most ``--models`` at once; a new one evicts
  the least recently used. Each is ``Qwen3TTSModel.from_pretrained(model_dir)``, float32 on CPU,
  bfloat16 (float16 where the card lacks it) on CUDA, with the hub offline.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import gc
import importlib
import importlib.util
import io
import logging
import os
import queue
import shutil
import sys
import threading
import time
import types
import wave
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KEY_ENV = "WERK_QWEN_TTS_WORKER_KEY"
CONTENT_TYPES: dict[str, str] = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac", "mp3": "audio/mpeg"}
#: soundfile's (format, subtype) for the formats it encodes.
SOUNDFILE: dict[str, tuple[str, str]] = {"flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III")}
MODEL_TYPES = ("custom_voice", "voice_design", "base")
#: The least time between two progress lines (the first step always sends one).
PROGRESS_S = 0.1
#: The package's fallback when neither the request nor generation_config.json sets it.
PACKAGE_MAX_NEW_TOKENS = 2048
#: The one torchaudio module qwen_tts imports (at the top of its 25 Hz tokenizer), and its parents.
_TORCHAUDIO = ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi")


class _Stop(Exception):
    """Raised from the talker-step hook to stop a cancelled generation."""


def _no_kaldi(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("torchaudio is not installed: its kaldi fbank (the 25 Hz tokenizer's x-vectors) is unavailable")


def import_qwen_tts() -> Any:
    """Import and return ``qwen_tts``, offline (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` set
    first, before anything reads them).

    ``import qwen_tts`` imports ``torchaudio.compliance.kaldi`` at the top, used only by the
    x-vector extractor of the 25 Hz speech tokenizer (never by the 12 Hz models, nor by custom
    voice or voice design), and PyPI has no torchaudio built for this torch. Where torchaudio is
    not installed, a stand-in module (its ``fbank`` raises) is in ``sys.modules`` while
    ``qwen_tts`` imports and is taken out after, so that nothing else sees a torchaudio;
    ``transformers`` is imported first, as its table of available packages must not see it.
    """
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if "qwen_tts" in sys.modules:
        return sys.modules["qwen_tts"]
    importlib.import_module("torch")
    transformers: Any = importlib.import_module("transformers")
    transformers.utils.logging.set_verbosity_error()
    _import_sox_quietly()
    with contextlib.redirect_stdout(io.StringIO()):  # qwen_tts prints a flash-attn notice on stdout
        return _import_with_kaldi_stand_in()


def _import_sox_quietly() -> None:
    """Import pysox (qwen_tts imports it for the 25 Hz tokenizer only) without its complaint,
    on stderr from a shell and its logger, that no ``sox`` program is on PATH: none is needed."""
    if shutil.which("sox") is not None or importlib.util.find_spec("sox") is None:
        return
    log = logging.getLogger("sox")
    disabled, log.disabled = log.disabled, True
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        importlib.import_module("sox")
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
        log.disabled = disabled


def _import_with_kaldi_stand_in() -> Any:
    if importlib.util.find_spec("torchaudio") is not None:
        return importlib.import_module("qwen_tts")
    stubs = {name: types.ModuleType(name) for name in _TORCHAUDIO}
    stubs["torchaudio.compliance.kaldi"].fbank = _no_kaldi  # type: ignore[attr-defined]
    stubs["torchaudio"].compliance = stubs["torchaudio.compliance"]  # type: ignore[attr-defined]
    stubs["torchaudio.compliance"].kaldi = stubs["torchaudio.compliance.kaldi"]  # type: ignore[attr-defined]
    sys.modules.update(stubs)
    try:
        return importlib.import_module("qwen_tts")
    finally:
        for name, stub in stubs.items():
            if sys.modules.get(name) is stub:
                del sys.modules[name]


def takes_instructions(tts: Any) -> bool:
    """Whether ``instructions`` reaches the model ``tts`` (a ``Qwen3TTSModel``).

    * ``custom_voice``: ``generate_custom_voice(instruct=...)`` takes a style prompt, but the
      package drops it when ``tts_model_size in "0b6"`` (the 0.6B CustomVoice model; a substring
      test, so an empty size too): the same test here.
    * ``voice_design``: ``generate_voice_design(instruct=...)`` is the voice description; this
      worker requires it.
    * ``base`` (voice clone): ``generate_voice_clone`` has no instruction at all.
    """
    kind = str(tts.model.tts_model_type)
    if kind == "voice_design":
        return True
    return kind == "custom_voice" and str(tts.model.tts_model_size) not in "0b6"


def max_new_tokens(tts: Any, body: dict[str, Any]) -> int:
    """The talker-step bound of ``body``: its ``max_new_tokens``, else the model's default."""
    value = body.get("max_new_tokens")
    if value is None:
        value = (getattr(tts, "generate_defaults", None) or {}).get("max_new_tokens", PACKAGE_MAX_NEW_TOKENS)
    return int(value)


def synthesize(torch: Any, tts: Any, body: dict[str, Any]) -> tuple[Any, int]:
    """One ``/speech`` request's samples on ``tts`` (a ``qwen_tts.Qwen3TTSModel``): float32 mono
    samples (a numpy array) and their sample rate. ``torch.manual_seed(body["seed"])`` first, so
    the same body gives the same samples; the sampling parameters are the model's defaults."""
    import numpy as np

    kind = str(tts.model.tts_model_type)
    language = body.get("language") or "Auto"
    kwargs: dict[str, Any] = {"language": language, "non_streaming_mode": True}
    if body.get("max_new_tokens") is not None:
        kwargs["max_new_tokens"] = int(body["max_new_tokens"])
    torch.manual_seed(int(body["seed"]))
    with torch.inference_mode():
        if kind == "custom_voice":
            instruct = body.get("instructions") or None
            wavs, rate = tts.generate_custom_voice(
                body["input"], speaker=body.get("voice"), instruct=instruct, **kwargs
            )
        elif kind == "voice_design":
            wavs, rate = tts.generate_voice_design(
                body["input"], instruct=str(body.get("instructions") or ""), **kwargs
            )
        elif kind == "base":
            raise ValueError("voice cloning needs a reference audio, which this route does not take")
        else:
            raise ValueError(f"unknown tts_model_type {kind!r}")
    return np.asarray(wavs[0], dtype=np.float32).reshape(-1), int(rate)


def pcm16(samples: Any) -> Any:
    """``samples`` (float, [-1, 1]) as int16: clipped, then ``round(x * 32767)``."""
    import numpy as np

    clipped = np.clip(np.asarray(samples, dtype=np.float32).reshape(-1), -1.0, 1.0)
    return np.round(clipped * 32767.0).astype("<i2")


def encode(samples: Any, sample_rate: int, fmt: str) -> bytes:
    """``samples`` (float32 mono) as ``fmt``: ``wav`` a 16-bit PCM mono WAV, ``pcm`` the same
    int16 little-endian samples raw (no header), ``flac`` 16-bit FLAC and ``mp3`` MPEG layer III
    (both by soundfile). The wav, pcm and flac samples are :func:`pcm16`'s."""
    if fmt == "pcm":
        return bytes(pcm16(samples).tobytes())
    if fmt == "wav":
        buffer = io.BytesIO()
        with wave.open(buffer, "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(int(sample_rate))
            out.writeframes(pcm16(samples).tobytes())
        return buffer.getvalue()
    if fmt in SOUNDFILE:
        import numpy as np

        sf: Any = importlib.import_module("soundfile")
        container, subtype = SOUNDFILE[fmt]
        data = pcm16(samples) if fmt == "flac" else np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0)
        buffer = io.BytesIO()
        sf.write(buffer, data, int(sample_rate), format=container, subtype=subtype)
        return buffer.getvalue()
    raise ValueError(f"unknown format {fmt!r}")


def available_formats() -> list[str]:
    """The formats :func:`encode` produces here: ``wav`` and ``pcm``, then each of ``flac`` and
    ``mp3`` that soundfile lists and that encodes a short tone without error."""
    import numpy as np

    formats = ["wav", "pcm"]
    try:
        sf: Any = importlib.import_module("soundfile")
    except (ImportError, OSError):
        return formats
    tone = (0.25 * np.sin(2 * np.pi * 440.0 * np.arange(2400) / 24000.0)).astype(np.float32)
    for fmt, (container, subtype) in SOUNDFILE.items():
        try:
            if container not in sf.available_formats() or subtype not in sf.available_subtypes(container):
                continue
            if encode(tone, 24000, fmt):
                formats.append(fmt)
        except Exception:  # noqa: BLE001, S112 - a libsndfile that cannot encode it: not offered
            continue
    return formats


@dataclass
class Loaded:
    """One loaded model and what ``/models`` says of it."""

    tts: Any
    tts_model_type: str
    speakers: list[str]
    languages: list[str]
    sample_rate: int
    instructions: bool

    def describe(self, identity: str) -> dict[str, Any]:
        return {
            "identity": identity,
            "tts_model_type": self.tts_model_type,
            "speakers": list(self.speakers),
            "languages": list(self.languages),
            "sample_rate": self.sample_rate,
            "instructions": self.instructions,
        }


def load_model(torch: Any, qwen_tts: Any, model_dir: str, device: str) -> Loaded:
    """``model_dir``'s ``Qwen3TTSModel`` (module docstring) on ``device``."""
    cuda = device.startswith("cuda")
    half = torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float16
    dtype = half if cuda else torch.float32
    tts = qwen_tts.Qwen3TTSModel.from_pretrained(model_dir, dtype=dtype)
    if cuda:  # moved by hand: the package's device_map path needs accelerate
        target = torch.device(device)
        tts.model.to(target)
        tts.device = target
        codec = tts.model.speech_tokenizer
        codec.model.to(target)
        codec.device = target
    kind = str(tts.model.tts_model_type)
    return Loaded(
        tts=tts,
        tts_model_type=kind,
        speakers=list(tts.get_supported_speakers() or []),
        languages=list(tts.get_supported_languages() or []),
        sample_rate=int(tts.model.speech_tokenizer.get_output_sample_rate()),
        instructions=takes_instructions(tts),
    )


def _optional_str(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{name} must be a string or null")
    return value or None


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_body(body: dict[str, Any], formats: list[str]) -> dict[str, Any]:
    """``body`` checked (``ValueError`` on the first fault) and normalized: empty strings are null."""
    identity, model_dir = body.get("identity"), body.get("model_dir")
    if not isinstance(identity, str) or not identity or not isinstance(model_dir, str) or not model_dir:
        raise ValueError("identity and model_dir are required")
    text = body.get("input")
    if not isinstance(text, str) or not text.strip():
        raise ValueError("input must be a non-empty string")
    fmt = body.get("format", "wav")
    if fmt not in formats:
        raise ValueError(f"format {fmt!r} is not available here (one of {', '.join(formats)})")
    if not _int(body.get("seed")):
        raise ValueError("seed must be an integer")
    limit = body.get("max_new_tokens")
    if limit is not None and (not _int(limit) or limit < 1):
        raise ValueError("max_new_tokens must be a positive integer or null")
    return {
        "identity": identity,
        "model_dir": model_dir,
        "input": text,
        "voice": _optional_str(body, "voice"),
        "language": _optional_str(body, "language"),
        "instructions": _optional_str(body, "instructions"),
        "format": fmt,
        "seed": int(body["seed"]),
        "max_new_tokens": limit,
    }


def check_for_model(loaded: Loaded, request: dict[str, Any]) -> None:
    """The request's faults that depend on the model (``ValueError``)."""
    kind = loaded.tts_model_type
    if kind == "base":
        raise ValueError("voice cloning needs a reference audio, which this route does not take")
    if kind not in MODEL_TYPES:
        raise ValueError(f"unknown tts_model_type {kind!r}")
    language = request["language"]
    if language is not None and loaded.languages and language.lower() not in loaded.languages:
        raise ValueError(f"unknown language {language!r} (one of {', '.join(loaded.languages)})")
    if kind == "custom_voice":
        voice = request["voice"]
        if voice is None or (loaded.speakers and voice.lower() not in loaded.speakers):
            raise ValueError(f"voice must be one of {', '.join(loaded.speakers)}, not {voice!r}")
    elif request["instructions"] is None:
        raise ValueError("a voice-design model needs instructions (the voice's description)")


class Engine:
    """The model LRU (the kit's engine: ``answer`` and ``stream`` only)."""

    def __init__(self, device: str, capacity: int) -> None:
        self.qwen_tts: Any = import_qwen_tts()
        self.torch: Any = importlib.import_module("torch")
        if device == "auto":
            device = "cuda" if self.torch.cuda.is_available() else "cpu"
        if device != "cpu" and not device.startswith("cuda"):
            raise ValueError(f"unknown device {device!r}")
        self.device = device
        self.capacity = max(1, capacity)
        self.formats = available_formats()
        self.models: OrderedDict[str, Loaded] = OrderedDict()
        self.lru_lock = threading.Lock()

    def answer(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        if path != "/models":
            return None
        with self.lru_lock:
            loaded = [m.describe(identity) for identity, m in self.models.items()]
        return {"loaded": loaded, "formats": list(self.formats)}

    def model(self, identity: str, model_dir: str) -> Loaded:
        """``identity``'s model, loaded now (evicting the least recently used) when it is not."""
        with self.lru_lock:
            found = self.models.get(identity)
            if found is not None:
                self.models.move_to_end(identity)
                return found
            while len(self.models) >= self.capacity:
                self.models.popitem(last=False)
        if not Path(model_dir).is_dir():
            raise ValueError("the model folder is not a directory")
        gc.collect()
        if self.device.startswith("cuda"):
            self.torch.cuda.empty_cache()
        loaded = load_model(self.torch, self.qwen_tts, model_dir, self.device)
        with self.lru_lock:
            self.models[identity] = loaded
        return loaded

    def stream(self, path: str, body: dict[str, Any], cancelled: threading.Event) -> Iterator[dict[str, Any]] | None:
        if path != "/speech":
            return None
        return self._speech(check_body(body, self.formats), cancelled)

    def _speech(self, request: dict[str, Any], cancelled: threading.Event) -> Iterator[dict[str, Any]]:
        loaded = self.model(request["identity"], request["model_dir"])
        check_for_model(loaded, request)
        steps = max_new_tokens(loaded.tts, request)
        events: queue.Queue[tuple[str, Any]] = queue.Queue()
        done = [0]
        last = [0.0]

        def on_step(module: Any, args: Any) -> None:
            if cancelled.is_set():
                raise _Stop()
            done[0] += 1
            now = time.monotonic()
            if now - last[0] >= PROGRESS_S:  # a line per step would cost the synthesis time
                last[0] = now
                events.put(("progress", done[0]))

        def work() -> None:
            # one talker forward is one generated frame (the package's model.generate drops
            # extra kwargs such as stopping_criteria, so progress and cancel hook the talker)
            handle = loaded.tts.model.talker.register_forward_pre_hook(on_step)
            try:
                samples, rate = synthesize(self.torch, loaded.tts, request)
                events.put(("result", (samples, rate)))
            except _Stop:
                events.put(("cancelled", None))
            except BaseException as err:  # noqa: BLE001 - handed to the stream
                events.put(("error", err))
            finally:
                handle.remove()

        thread = threading.Thread(target=work, name="synthesis", daemon=True)
        thread.start()
        try:
            while True:
                kind, value = events.get()
                if kind == "progress":
                    yield {"event": "progress", "step": value, "steps": steps}
                elif kind == "result":
                    yield self._result(loaded, request, *value)
                    return
                elif kind == "cancelled":
                    yield {"event": "cancelled"}
                    return
                else:
                    raise value
        finally:
            cancelled.set()  # closed early (the client went away): stop at the next step
            thread.join()

    @staticmethod
    def _result(loaded: Loaded, request: dict[str, Any], samples: Any, rate: int) -> dict[str, Any]:
        fmt = request["format"]
        n = int(samples.shape[0])
        return {
            "event": "result",
            "audio": base64.b64encode(encode(samples, rate, fmt)).decode(),
            "format": fmt,
            "content_type": CONTENT_TYPES[fmt],
            "sample_rate": rate,
            "samples": n,
            "seconds": n / rate if rate else 0.0,
            "info": {
                "tts_model_type": loaded.tts_model_type,
                "voice": request["voice"].lower() if loaded.tts_model_type == "custom_voice" else None,
                "language": request["language"] or "Auto",
                "seed": request["seed"],
            },
        }


def _kit(path: str) -> Any:
    """The kit's worker side (``werk_host/plugin/engine_worker.py``), by path: no Werk here."""
    spec = importlib.util.spec_from_file_location("werk_engine_worker", path)
    kit = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(kit)  # type: ignore[union-attr]
    return kit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="worker.py")
    parser.add_argument("--kit", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--models", type=int, default=1)
    args = parser.parse_args(argv)
    if not Path(args.kit).is_file():
        parser.error(f"--kit {args.kit}: no such file")

    def load() -> Engine:
        engine = Engine(args.device, args.models)
        if args.threads > 0:
            engine.torch.set_num_threads(args.threads)
        return engine

    status: int = _kit(args.kit).run(KEY_ENV, args.port, load)
    return status


if __name__ == "__main__":
    sys.exit(main())
