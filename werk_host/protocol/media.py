"""Media DTOs: image generation requests, what a media backend allows, and job records
(docs/media.md).

:class:`ImageRequest` is the one request every image route becomes (OpenAI's
``/v1/images/*``, AUTOMATIC1111's ``/sdapi/v1/*``, Comfy's ``/prompt``, a ``kind: image`` job):
each route translates its own fields into it and validates it here, before anything runs, so
the bounds below hold on every route alike. ``init_image`` is the decoded image (PNG or JPEG
bytes), never base64. A request's ``seed`` is always concrete by the time it reaches a backend
(the host draws one for ``-1``/absent): image *i* of a batch uses ``seed + i``, so the same
request gives the same images (docs/media.md, "Determinism").

:class:`ImageLimits` is what a media adapter says about itself (``werk_image_limits``): the
sampler names it accepts (A1111's names: ``Euler``, ``Euler a``, ``DDIM``, ...), its default
sampler, size and steps, and whether it can do image-to-image. A request naming a sampler
outside the list is ``invalid_request`` before any work.

Jobs (:class:`JobView`): a job (``kind`` ``image``, or ``speech`` with a
:class:`~werk_host.protocol.speech.SpeechRequest`) stores the request, status and eventual
result under ``WERK_HOME/jobs`` (werk_host/store/jobs.py); statuses move ``queued`` →
``running`` → one of the terminal ``succeeded``, ``failed``, ``cancelled``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Final, Literal, Self

from pydantic import BeforeValidator, Field, JsonValue, RootModel, StrictInt, StrictStr, model_validator

from werk_host.protocol.base import DataModel, JsonFloat, StrictModel, integral_number
from werk_host.protocol.speech import SpeechInput

#: The largest image side and pixel count a request may ask for.
MAX_IMAGE_SIDE: Final = 2048
MAX_IMAGE_PIXELS: Final = 2048 * 2048
#: Image sides are multiples of this (the latent space's factor).
IMAGE_SIDE_MULTIPLE: Final = 8
MAX_IMAGE_STEPS: Final = 150
MAX_IMAGE_BATCH: Final = 8
MAX_PROMPT_CHARS: Final = 16_384
MAX_SEED: Final = 2**32 - 1
#: The largest decoded init image, and the largest body of a media route (base64 grows 4/3).
MAX_INIT_IMAGE_BYTES: Final = 8 << 20
MAX_MEDIA_REQUEST_BYTES: Final = 16 << 20

#: Base64 data, optionally as a ``data:`` URL (what ``init_image`` fields carry).
BASE64_PATTERN: Final = r"^(data:[A-Za-z0-9/+.-]*;base64,)?([A-Za-z0-9+/]{4})+([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
Side = Annotated[
    StrictInt,
    Field(ge=IMAGE_SIDE_MULTIPLE, le=MAX_IMAGE_SIDE, multiple_of=IMAGE_SIDE_MULTIPLE),
    BeforeValidator(integral_number),
]
Prompt = Annotated[StrictStr, Field(max_length=MAX_PROMPT_CHARS)]


class ImageMode(StrEnum):
    TXT2IMG = "txt2img"
    IMG2IMG = "img2img"


class _ImageFields(StrictModel):
    """The fields every image request has (module docstring)."""

    prompt: Prompt
    negative_prompt: Prompt = ""
    width: Side = 512
    height: Side = 512
    steps: Annotated[StrictInt, Field(ge=1, le=MAX_IMAGE_STEPS), BeforeValidator(integral_number)] | None = None
    guidance_scale: Annotated[JsonFloat, Field(ge=0, le=50)] = 7.0
    seed: Annotated[StrictInt, Field(ge=0, le=MAX_SEED), BeforeValidator(integral_number)] | None = None
    sampler: Annotated[StrictStr, Field(max_length=64)] | None = None
    n: Annotated[StrictInt, Field(ge=1, le=MAX_IMAGE_BATCH), BeforeValidator(integral_number)] = 1
    strength: Annotated[JsonFloat, Field(gt=0, le=1)] = 0.75

    @model_validator(mode="after")
    def _pixels(self) -> Self:
        if self.width * self.height > MAX_IMAGE_PIXELS:
            raise ValueError(f"width x height must be at most {MAX_IMAGE_PIXELS} pixels")
        return self


class ImageRequest(_ImageFields):
    """One image generation (module docstring). ``n`` images of ``width`` x ``height``."""

    model: StrictStr | None = None
    init_image: bytes | None = Field(default=None, max_length=MAX_INIT_IMAGE_BYTES)

    @property
    def mode(self) -> ImageMode:
        return ImageMode.IMG2IMG if self.init_image is not None else ImageMode.TXT2IMG


class ImageInput(_ImageFields):
    """A ``kind: image`` job's ``input``: an :class:`ImageRequest` without ``model`` (the job
    names it), its ``init_image`` base64 (a ``data:`` URL prefix allowed)."""

    init_image: (
        Annotated[StrictStr, Field(max_length=(MAX_INIT_IMAGE_BYTES * 4) // 3 + 64, pattern=BASE64_PATTERN)] | None
    ) = None


class ImageLimits(DataModel):
    """What a media adapter accepts (module docstring)."""

    samplers: list[str]
    default_sampler: str
    default_steps: int = 20
    default_size: int = 512
    img2img: bool = False


class ImageResult(DataModel):
    """The images of one request, PNG bytes each, and the seed each was made with; ``info``
    says what ran (the sampler, steps, the pipeline's class) for the routes that echo it."""

    images: list[bytes]
    seeds: list[int]
    info: dict[str, JsonValue] = Field(default_factory=dict)


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


JobKind = Literal["image", "speech"]


class ImageJobCreate(StrictModel):
    """A ``kind: image`` job: ``input`` is an :class:`ImageInput`."""

    kind: Literal["image"]
    model: StrictStr | None = None
    input: ImageInput


class SpeechJobCreate(StrictModel):
    """A ``kind: speech`` job: ``input`` is a :class:`~werk_host.protocol.speech.SpeechInput`."""

    kind: Literal["speech"]
    model: StrictStr | None = None
    input: SpeechInput


class JobCreate(RootModel[Annotated[ImageJobCreate | SpeechJobCreate, Field(discriminator="kind")]]):
    """``POST /werk/v1/jobs``: ``input`` is the kind's request (``root`` is the job of that kind)."""


class JobProgress(DataModel):
    step: int = 0
    steps: int = 0
    fraction: float = 0.0


class JobFile(DataModel):
    name: str
    bytes: int
    content_type: str


class JobError(DataModel):
    code: str
    message: str


class JobView(DataModel):
    """A job as the protocol shows it (never its owner or the request's images)."""

    id: str
    kind: str
    model: str | None
    status: JobStatus
    progress: JobProgress
    created_unix_ms: int
    started_unix_ms: int | None = None
    finished_unix_ms: int | None = None
    results: list[JobFile] = Field(default_factory=list)
    error: JobError | None = None
    info: dict[str, JsonValue] = Field(default_factory=dict)
