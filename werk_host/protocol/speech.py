"""Speech DTOs: a speech request, what a speech backend offers, and its audio (docs/media.md,
"Speech").

:class:`SpeechRequest` is the one request every speech route becomes (OpenAI's
``POST /v1/audio/speech``, a ``kind: speech`` job): each route translates its fields into it
and validates it here, before anything runs. ``input`` is 1 to :data:`MAX_SPEECH_CHARS`
characters (OpenAI's own bound). ``voice``, ``response_format``, ``language``, ``speed`` and
``instructions`` are checked against the backend's :class:`SpeechLimits` by the host
(werk_host/service/media.py) before any work; absent, ``voice`` and ``response_format`` take
the backend's defaults. A request's ``seed`` is always concrete by the time it reaches a
backend (the host draws one when absent): the same request gives the same samples
(docs/media.md, "Determinism").

:class:`SpeechLimits` is what a speech adapter says about itself (``werk_speech_limits``),
cheaply and from evidence: the voices and languages its model offers, the audio formats its
engine environment can encode, whether it takes a style prompt (``instructions``) and a
``speed``, and whether it streams. :class:`SpeechResult` is the encoded audio.
"""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import BeforeValidator, Field, JsonValue, StrictInt, StrictStr

from werk_host.protocol.base import DataModel, JsonFloat, StrictModel, integral_number

#: The longest ``input`` (characters), OpenAI's bound for ``/v1/audio/speech``.
MAX_SPEECH_CHARS: Final = 4096
MAX_INSTRUCTIONS_CHARS: Final = 4096
MAX_SPEECH_SEED: Final = 2**32 - 1
#: OpenAI's ``speed`` range; a backend without a speed control takes only 1.0.
MIN_SPEED: Final = 0.25
MAX_SPEED: Final = 4.0
#: Every format a route may name, and its content type (a backend lists those it encodes).
AUDIO_CONTENT_TYPES: Final[dict[str, str]] = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}


def _as_float(value: object) -> object:
    """A JSON integer as the float it means (``1`` is ``1.0``); anything else, and an integer
    too large for a float, unchanged (the strict float then refuses it)."""
    if type(value) is int and abs(value) <= 2**53:
        return float(value)
    return value


Name = Annotated[StrictStr, Field(min_length=1, max_length=64)]


class _SpeechFields(StrictModel):
    """The fields every speech request has (module docstring)."""

    input: Annotated[StrictStr, Field(min_length=1, max_length=MAX_SPEECH_CHARS)]
    voice: Name | None = None
    response_format: Annotated[StrictStr, Field(min_length=1, max_length=16)] | None = None
    speed: Annotated[JsonFloat, Field(ge=MIN_SPEED, le=MAX_SPEED), BeforeValidator(_as_float)] | None = None
    instructions: Annotated[StrictStr, Field(max_length=MAX_INSTRUCTIONS_CHARS)] | None = None
    language: Name | None = None
    seed: Annotated[StrictInt, Field(ge=0, le=MAX_SPEECH_SEED), BeforeValidator(integral_number)] | None = None


class SpeechRequest(_SpeechFields):
    """One speech synthesis (module docstring)."""

    model: StrictStr | None = None


class SpeechInput(_SpeechFields):
    """A ``kind: speech`` job's ``input``: a :class:`SpeechRequest` without ``model`` (the job
    names it)."""


class SpeechLimits(DataModel):
    """What a speech adapter offers (module docstring). ``voices`` empty: the model has no named
    voices and takes none; ``languages`` empty: it takes no language hint."""

    voices: list[str]
    default_voice: str | None = None
    languages: list[str] = Field(default_factory=list)
    formats: list[str]
    default_format: str
    instructions: bool = False
    speed: bool = False
    streaming: bool = False
    sample_rate: int | None = None


class SpeechResult(DataModel):
    """The encoded audio of one request: ``audio`` in ``format`` (its ``content_type``),
    ``sample_rate`` samples per second, ``seconds`` long; ``info`` says what ran."""

    audio: bytes
    format: str
    content_type: str
    sample_rate: int
    seconds: float
    info: dict[str, JsonValue] = Field(default_factory=dict)
