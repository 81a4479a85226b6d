"""The typed seam over ``mistralrs`` (mistral.rs's Python bindings): load, tokenize, stream.

Everything the bridge asks of the engine goes through this module, so the untyped binding
appears nowhere else. Facts it relies on (measured with mistralrs 0.9.5; docs/candle.md):

* ``Runner(which=Which.GGUF(quantized_model_id=DIR, quantized_filename=FILE),
  token_source="none")`` loads a local GGUF fully offline; ``jinja_explicit`` names the
  explicit chat template (:func:`werk_candle_bridge.template.engine_template`).
* Two threads calling the Runner at once fail (``Already borrowed``): every Runner call is
  made under :attr:`Engine.lock`. A *streaming* request returns at once; its chunks are read
  outside the lock, so concurrent requests queue inside the engine.
* ``max_seqs`` > 1 lets the engine batch sequences, which fails inside it on quantized models
  (``input tensor is not contiguous``); the default is 1.
* Dropping a stream's iterator cancels its sequence in the engine.
* Engine failures arrive as ``ValueError``/``RuntimeError`` carrying backtraces, or as a Rust
  panic (``pyo3_runtime.PanicException``, a ``BaseException``). :func:`engine_call` turns each
  into :class:`EngineFailure`, whose detail is for the server log only.
* Dropping the last reference to the Runner frees the weights (the mmap); ``malloc_trim``
  hands freed heap back to the system (:func:`release_memory`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import importlib
import logging
import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Protocol, TypeVar, cast

from werk_host.plugin.openai import Usage

__all__ = [
    "DISTRIBUTION",
    "Engine",
    "EngineFailure",
    "EngineSettings",
    "EngineStream",
    "Piece",
    "Sampling",
    "engine_call",
    "load_engine",
    "missing_engine_reason",
    "release_memory",
]

log = logging.getLogger(__name__)

DISTRIBUTION = "mistralrs"
MAX_DETAIL = 2000
T = TypeVar("T")


class EngineFailure(Exception):
    """The engine failed (raised or panicked); ``detail`` is its own text, for the log only."""

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(what)
        self.what = what
        self.detail = detail[:MAX_DETAIL]


def engine_call(what: str, call: Callable[[], T]) -> T:
    """``call()``, with any engine exception or panic raised as :class:`EngineFailure`."""
    try:
        return call()
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as err:  # noqa: BLE001 - a Rust panic is a BaseException (module docstring)
        raise EngineFailure(what, f"{type(err).__name__}: {err}") from err


@cache
def _module() -> ModuleType | str:
    try:
        return importlib.import_module(DISTRIBUTION)
    except ImportError as err:
        platforms = "Linux x86_64, macOS arm64 and Windows x86_64"
        return f"the mistralrs engine is not installed here ({err.msg}); it has wheels for {platforms} only"
    except Exception as err:  # noqa: BLE001 - a broken native module must not break plugin loading
        return f"the mistralrs engine failed to import ({type(err).__name__})"


def missing_engine_reason() -> str | None:
    """Why the engine cannot be used in this process, or ``None`` when it can."""
    found = _module()
    return found if isinstance(found, str) else None


def _engine_module() -> ModuleType:
    found = _module()
    if isinstance(found, str):
        raise EngineFailure("import", found)
    return found


# -- the binding's shapes, as far as the bridge reads them -------------------------------------


class _Details(Protocol):
    cached_tokens: int


class _Usage(Protocol):
    prompt_tokens: int
    completion_tokens: int


class _Delta(Protocol):
    content: str | None


class _Choice(Protocol):
    delta: _Delta
    finish_reason: str | None


class _Chunk(Protocol):
    choices: Sequence[_Choice]
    usage: _Usage | None


class _Runner(Protocol):
    def send_chat_completion_request(self, request: object) -> Iterator[_Chunk]: ...
    def tokenize_text(self, text: str, add_special_tokens: bool, enable_thinking: bool | None) -> list[int]: ...
    def max_sequence_length(self) -> int | None: ...


@dataclass(frozen=True)
class EngineSettings:
    """How a Runner is started; part of the key a loaded model is shared under."""

    max_seqs: int = 1
    prefix_cache_n: int = 0

    def arguments(self) -> list[str]:
        """The Runner's effective settings as ``NAME=VALUE`` words (for the deployment plan)."""
        return [
            f"max_seqs={self.max_seqs}",
            f"prefix_cache_n={self.prefix_cache_n}",
            "token_source=none",
            "jinja_explicit=<path>",
        ]


@dataclass(frozen=True)
class Sampling:
    """Generation options, already validated (:mod:`werk_candle_bridge.wire`)."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    stop: tuple[str, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()
    ignore_eos: bool = False


@dataclass(frozen=True)
class Piece:
    """Text the engine produced since the previous piece; ``finish_reason`` on the last one."""

    text: str
    finish_reason: str | None


class EngineStream:
    """One request's chunks. :meth:`close` (idempotent) drops the iterator, which cancels the
    sequence in the engine when it has not finished."""

    def __init__(self, chunks: Iterator[_Chunk]) -> None:
        self._chunks: Iterator[_Chunk] | None = chunks
        self.usage: Usage | None = None

    def next(self) -> Piece | None:
        """The next piece, or ``None`` at the end. Raises :class:`EngineFailure`."""
        chunks = self._chunks
        if chunks is None:
            return None
        chunk = engine_call("generation", lambda: next(chunks, None))
        if chunk is None:
            self.close()
            return None
        usage = chunk.usage
        if usage is not None:
            details = cast(_Details | None, getattr(usage, "prompt_tokens_details", None))
            cached = getattr(details, "cached_tokens", None) if details is not None else None
            self.usage = Usage(
                int(usage.prompt_tokens), int(usage.completion_tokens), cached if isinstance(cached, int) else None
            )
        if not chunk.choices:
            return Piece("", None)
        choice = chunk.choices[0]
        return Piece(choice.delta.content or "", choice.finish_reason)

    def close(self) -> None:
        self._chunks = None


class Engine:
    """One model loaded by the engine (see the module docstring). Thread-safe."""

    def __init__(self, runner: _Runner, settings: EngineSettings) -> None:
        self.lock = threading.Lock()
        self.settings = settings
        self.generation = secrets.token_hex(8)
        self._runner: _Runner | None = runner
        self.max_sequence_length = engine_call("max_sequence_length", runner.max_sequence_length)

    def _live(self) -> _Runner:
        runner = self._runner
        if runner is None:
            raise EngineFailure("use", "the model was unloaded")
        return runner

    def tokenize(self, text: str) -> list[int]:
        """The engine tokenizer's ids for ``text`` (no special tokens added, as for a prompt)."""
        with self.lock:
            runner = self._live()
            return engine_call("tokenize", lambda: runner.tokenize_text(text, False, None))

    def open(self, prompt: str, sampling: Sampling, raw_role: str) -> EngineStream:
        """Submit ``prompt`` (sent as one ``raw_role`` message) and return its stream."""
        module = _engine_module()
        request = engine_call(
            "request",
            lambda: module.ChatCompletionRequest(
                messages=[{"role": raw_role, "content": prompt}],
                model="default",
                stream=True,
                max_tokens=sampling.max_tokens,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                min_p=sampling.min_p,
                presence_penalty=sampling.presence_penalty,
                frequency_penalty=sampling.frequency_penalty,
                repetition_penalty=sampling.repetition_penalty,
                stop_seqs=list(sampling.stop) or None,
                logit_bias=dict(sampling.logit_bias) or None,
                ignore_eos=sampling.ignore_eos,
            ),
        )
        with self.lock:
            runner = self._live()
            chunks = engine_call("submit", lambda: runner.send_chat_completion_request(request))
        return EngineStream(chunks)

    def close(self) -> None:
        """Drop the Runner (the weights go with its last reference) and return freed memory."""
        with self.lock:
            self._runner = None
        release_memory()


def load_engine(model: Path, template: Path, settings: EngineSettings) -> Engine:
    """Load the GGUF file ``model`` with the explicit chat template file ``template``.

    Raises :class:`EngineFailure` when the engine is missing or cannot load the file."""
    module = _engine_module()

    def start() -> _Runner:
        which = module.Which.GGUF(quantized_model_id=str(model.parent), quantized_filename=model.name)
        return cast(
            _Runner,
            module.Runner(
                which=which,
                token_source="none",
                max_seqs=settings.max_seqs,
                prefix_cache_n=settings.prefix_cache_n,
                jinja_explicit=str(template),
            ),
        )

    return Engine(engine_call("load", start), settings)


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None  # not glibc
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return cast(Callable[[int], int], trim)


def release_memory() -> None:
    """Collect garbage (dropped engine objects) and hand freed heap back to the system."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
