"""Image generation for every image route (docs/media.md, "The media seam" and "Routes").

:class:`MediaService` is the one path an image request takes, whichever route it came by
(OpenAI ``/v1/images/*``, AUTOMATIC1111 ``/sdapi/v1/*``, Comfy ``/prompt``, a ``kind: image``
job). The contract:

* **Which instance.** ``model`` names an instance id, a served model name or an alias (the
  deployment set's own routing, as for chats); without one, the first instance whose backend
  declares ``media.image.txt2img``. An instance whose backend declares neither image
  capability is ``unsupported`` ("model X does not generate images"); no instance at all
  is ``unsupported``.
* **Validated before any work.** The route's fields become an
  :class:`~werk_host.protocol.media.ImageRequest` (its bounds: size, steps, batch, prompt,
  seed), then :meth:`MediaService.prepare` checks it against the adapter's
  :class:`~werk_host.protocol.media.ImageLimits`: an unknown sampler, or image-to-image on a
  backend without it, is ``invalid_request``. It fills in the default steps and sampler and
  draws a seed for an absent one, so the request that runs (and the job record that stores
  it) is exact: the same record gives the same images.
* **Admission as for chats.** A synchronous generation holds a gate ticket (the host-wide and
  per-key bounds, docs/operations.md, "Inference concurrency") and a seat on its instance (one
  generation at a time: the media backends serialize), and keeps the instance in use (no
  keep-alive unload under it) until it ends. A job's generation takes the same ticket and seat
  in the job runner's thread (werk_host/service/jobs.py).
* **Progress and interrupt per principal.** Each running generation is listed for its
  principal (:meth:`MediaService.active`: step, steps) until it ends, for AUTOMATIC1111's
  ``/sdapi/v1/progress``; :meth:`MediaService.interrupt` cancels that principal's running
  generations (``/sdapi/v1/interrupt``, Comfy's ``/interrupt``), never another key's.
* **Speech** (docs/media.md, "Speech") takes the same path: ``model`` routes among the
  instances whose backend declares ``media.speech.synthesis``;
  :meth:`MediaService.prepare_speech` checks the request against the adapter's
  :class:`~werk_host.protocol.speech.SpeechLimits` (an unknown voice, language or format,
  ``instructions`` or a ``speed`` other than 1 where the model takes none: ``invalid_request``)
  and makes it exact (voice, format, a seed drawn when absent); :meth:`MediaService.speak`
  runs it under the same gate ticket and seat as an image.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from werk_host.deployments.instances import Instance
from werk_host.errors import ErrorCode, WerkError
from werk_host.protocol.discovery import CapabilityId
from werk_host.protocol.media import MAX_SEED, ImageLimits, ImageRequest, ImageResult
from werk_host.protocol.speech import MAX_SPEECH_SEED, SpeechLimits, SpeechRequest, SpeechResult
from werk_host.seam import Adapter, ImageWork, SpeechWork, client_disconnected
from werk_host.service.fleet import Fleet
from werk_host.service.gate import InferenceGate, Ticket
from werk_host.service.principals import Principal

__all__ = ["Generation", "MediaKind", "MediaService", "Prepared", "PreparedSpeech", "is_media"]

#: How long the job runner waits between tries for a seat (werk_host/service/jobs.py).
SEAT_RETRY_S = 0.5
MediaKind = Literal["image", "speech"]
_CAPS: dict[MediaKind, tuple[CapabilityId, ...]] = {
    "image": (CapabilityId.IMAGE_TXT2IMG, CapabilityId.IMAGE_IMG2IMG),
    "speech": (CapabilityId.SPEECH_SYNTHESIS,),
}
#: What a route says when no instance, or the named one, does the kind.
_NONE: dict[MediaKind, str] = {
    "image": "image generation is not supported: no media model is served",
    "speech": "speech is not supported: no speech model is served",
}
_NOT: dict[MediaKind, str] = {"image": "does not generate images", "speech": "does not synthesize speech"}
R = TypeVar("R")


def is_media(instance: Instance, kind: MediaKind = "image") -> bool:
    """Whether ``instance``'s backend declares a capability of ``kind`` (no start needed)."""
    return any(cap in instance.factory.capabilities for cap in _CAPS[kind])


@dataclass(frozen=True)
class Prepared:
    """A request ready to run: its instance and the exact request (seed, steps, sampler set)."""

    instance: Instance
    request: ImageRequest
    limits: ImageLimits

    @property
    def model(self) -> str:
        return self.request.model or self.instance.id


@dataclass(frozen=True)
class PreparedSpeech:
    """A speech request ready to run: its instance and the exact request (voice, format, seed)."""

    instance: Instance
    request: SpeechRequest
    limits: SpeechLimits

    @property
    def model(self) -> str:
        return self.request.model or self.instance.id


@dataclass
class Generation:
    """One running generation of a principal (module docstring): its progress and its cancel."""

    principal_id: str
    model: str
    started: float = field(default_factory=time.monotonic)
    step: int = 0
    steps: int = 0
    cancel: threading.Event = field(default_factory=threading.Event)
    job_id: str | None = None
    kind: MediaKind = "image"

    def progress(self, step: int, steps: int) -> None:
        self.step, self.steps = step, steps

    @property
    def fraction(self) -> float:
        return self.step / self.steps if self.steps else 0.0


class MediaService:
    """The image path of every route (module docstring)."""

    def __init__(self, fleet: Fleet, gate: InferenceGate | None = None) -> None:
        self.fleet = fleet
        self.gate = gate
        self._lock = threading.Lock()
        self._running: list[Generation] = []

    # -- instances -------------------------------------------------------------------------
    def instances(self, kind: MediaKind = "image") -> list[Instance]:
        """The instances of ``kind``, in profile order."""
        deployments = self.fleet.deployments
        if deployments is not None:
            return [i for i in deployments.instances.values() if is_media(i, kind)]
        default = self.fleet.default
        return [default] if default is not None and is_media(default, kind) else []

    def resolve(self, model: str | None, kind: MediaKind = "image") -> Instance:
        """The instance serving ``model`` for ``kind`` (module docstring)."""
        deployments = self.fleet.deployments
        if model is None or deployments is None:
            found = self.instances(kind)
            if not found:
                raise WerkError(ErrorCode.UNSUPPORTED, _NONE[kind])
            return found[0]
        instance = deployments.route(model)
        if not is_media(instance, kind):
            raise WerkError(ErrorCode.UNSUPPORTED, f"model {model} {_NOT[kind]}")
        return instance

    def limits(self, instance: Instance) -> ImageLimits:
        """The adapter's image limits (its instance started when cold)."""
        adapter = instance.use()
        limits = self.fleet.hooks.image_limits(adapter)
        if limits is None:
            raise WerkError(ErrorCode.UNSUPPORTED, f"image generation is not supported by backend {adapter.backend}")
        return limits

    def prepare(self, request: ImageRequest) -> Prepared:
        """``request`` routed and checked against its adapter's limits, defaults filled in and
        its seed drawn when absent (module docstring)."""
        instance = self.resolve(request.model)
        limits = self.limits(instance)
        sampler = request.sampler or limits.default_sampler
        if sampler not in limits.samplers:
            raise WerkError(
                ErrorCode.INVALID_REQUEST,
                f"unknown sampler {sampler[:64]!r} (known: {', '.join(limits.samplers)})",
            )
        if request.init_image is not None and not limits.img2img:
            raise WerkError(ErrorCode.INVALID_REQUEST, f"model {instance.id} does not do image-to-image")
        seed = request.seed if request.seed is not None else secrets.randbelow(MAX_SEED + 1 - request.n)
        if seed + request.n - 1 > MAX_SEED:
            raise WerkError(ErrorCode.INVALID_REQUEST, f"seed + n - 1 must be at most {MAX_SEED}")
        exact = request.model_copy(
            update={"sampler": sampler, "steps": request.steps or limits.default_steps, "seed": seed}
        )
        return Prepared(instance, exact, limits)

    def speech_limits(self, instance: Instance) -> SpeechLimits:
        """The adapter's speech limits (its instance started when cold)."""
        adapter = instance.use()
        limits = self.fleet.hooks.speech_limits(adapter)
        if limits is None:
            raise WerkError(ErrorCode.UNSUPPORTED, f"speech is not supported by backend {adapter.backend}")
        return limits

    def prepare_speech(self, request: SpeechRequest) -> PreparedSpeech:
        """``request`` routed and checked against its adapter's limits, its voice, format and
        seed made concrete (module docstring)."""
        instance = self.resolve(request.model, "speech")
        limits = self.speech_limits(instance)
        voices = {v.lower(): v for v in limits.voices}
        voice = request.voice if request.voice is not None else limits.default_voice
        if voices and (voice is None or voice.lower() not in voices):
            raise WerkError(ErrorCode.INVALID_REQUEST, f"unknown voice (known: {', '.join(limits.voices)})")
        if not voices and request.voice is not None:
            raise WerkError(ErrorCode.INVALID_REQUEST, f"model {instance.id} has no named voices: leave voice out")
        fmt = request.response_format or limits.default_format
        if fmt not in limits.formats:
            raise WerkError(
                ErrorCode.INVALID_REQUEST, f"unsupported response_format (supported: {', '.join(limits.formats)})"
            )
        languages = {v.lower(): v for v in limits.languages}
        language = None
        if request.language is not None:
            language = languages.get(request.language.lower())
            if language is None:
                known = ", ".join(limits.languages) or "none"
                raise WerkError(ErrorCode.INVALID_REQUEST, f"unsupported language (supported: {known})")
        if request.speed is not None and request.speed != 1.0 and not limits.speed:
            raise WerkError(ErrorCode.INVALID_REQUEST, f"model {instance.id} has no speed control: speed must be 1.0")
        if request.instructions and not limits.instructions:
            raise WerkError(ErrorCode.INVALID_REQUEST, f"model {instance.id} takes no instructions (style prompt)")
        seed = request.seed if request.seed is not None else secrets.randbelow(MAX_SPEECH_SEED + 1)
        update = {
            "voice": voices[voice.lower()] if voice is not None and voices else None,
            "response_format": fmt,
            "language": language,
            "seed": seed,
        }
        return PreparedSpeech(instance, request.model_copy(update=update), limits)

    # -- running ---------------------------------------------------------------------------
    @contextmanager
    def _running_as(self, generation: Generation) -> Iterator[Generation]:
        with self._lock:
            self._running.append(generation)
        try:
            yield generation
        finally:
            with self._lock:
                self._running.remove(generation)

    def active(self, principal: Principal, kind: MediaKind = "image") -> list[Generation]:
        with self._lock:
            return [g for g in self._running if g.principal_id == principal.id and g.kind == kind]

    def interrupt(self, principal: Principal) -> int:
        """Cancel ``principal``'s running image generations; how many."""
        found = self.active(principal)
        for generation in found:
            generation.cancel.set()
        return len(found)

    def generate(
        self,
        principal: Principal,
        prepared: Prepared,
        *,
        generation: Generation | None = None,
        wait_for_seat: Callable[[], bool] | None = None,
    ) -> ImageResult:
        """Run ``prepared`` for ``principal`` inside the gate (module docstring). ``generation``:
        the record to report progress on and cancel through (made here when absent);
        ``wait_for_seat``: the job runner's "keep trying" (called between refused tries until
        it answers ``False``), where a request thread is refused at once."""
        generation = generation or Generation(principal.id, prepared.model)
        return self._admitted(principal, prepared.instance, generation, wait_for_seat, self._image(prepared))

    def speak(
        self,
        principal: Principal,
        prepared: PreparedSpeech,
        *,
        generation: Generation | None = None,
        wait_for_seat: Callable[[], bool] | None = None,
    ) -> SpeechResult:
        """Synthesize ``prepared`` for ``principal``, admitted exactly as :meth:`generate`."""
        generation = generation or Generation(principal.id, prepared.model, kind="speech")
        return self._admitted(principal, prepared.instance, generation, wait_for_seat, self._speech(prepared))

    def _admitted(
        self,
        principal: Principal,
        instance: Instance,
        generation: Generation,
        wait_for_seat: Callable[[], bool] | None,
        run: Callable[[Adapter, Generation, Callable[[], bool]], R],
    ) -> R:
        """``run`` on ``instance``'s adapter under the gate's ticket and a seat, the instance in
        use throughout (module docstring, "Admission"); its third argument says whether the
        generation is cancelled or the waiting client has gone."""
        gone = client_disconnected.get()

        def cancelled() -> bool:
            return generation.cancel.is_set() or (gone is not None and gone())

        ticket = None
        if self.gate is not None:
            ticket = self._ticket(principal, instance, generation, wait_for_seat)
        try:
            adapter = instance.use(enter=True)
            try:
                with self._running_as(generation):
                    if cancelled():
                        raise WerkError(ErrorCode.CONFLICT, "cancelled")
                    return run(adapter, generation, cancelled)
            finally:
                instance.leave()
        finally:
            if ticket is not None:
                ticket.release()

    def _ticket(
        self, principal: Principal, instance: Instance, generation: Generation, wait: Callable[[], bool] | None
    ) -> Ticket:
        assert self.gate is not None
        gone = client_disconnected.get()
        while True:
            try:
                ticket = self.gate.enter(principal.id)
            except WerkError as err:
                if wait is None or not err.retryable or not wait():
                    raise
                generation.cancel.wait(SEAT_RETRY_S)
                if generation.cancel.is_set():
                    raise WerkError(ErrorCode.CONFLICT, "cancelled") from err
                continue
            try:
                ticket.seat(instance.id, 1, gone or generation.cancel.is_set)
                return ticket
            except WerkError as err:
                ticket.release()
                if wait is None or not err.retryable or not wait() or generation.cancel.is_set():
                    if generation.cancel.is_set():
                        raise WerkError(ErrorCode.CONFLICT, "cancelled") from err
                    raise

    def _image(self, prepared: Prepared) -> Callable[[Adapter, Generation, Callable[[], bool]], ImageResult]:
        def run(adapter: Adapter, generation: Generation, cancelled: Callable[[], bool]) -> ImageResult:
            work = ImageWork(prepared.request, generation.progress, cancelled)
            result = self.fleet.hooks.generate_image(adapter, work)
            if result is None:
                raise WerkError(
                    ErrorCode.UNSUPPORTED, f"image generation is not supported by backend {adapter.backend}"
                )
            n = prepared.request.n
            if len(result.images) != n or len(result.seeds) != n:
                owner = self.fleet.plugins.owner_of(adapter)
                raise WerkError(ErrorCode.INTERNAL, f"plugin {owner} answered {n} image(s) wrongly")
            return result

        return run

    def _speech(self, prepared: PreparedSpeech) -> Callable[[Adapter, Generation, Callable[[], bool]], SpeechResult]:
        def run(adapter: Adapter, generation: Generation, cancelled: Callable[[], bool]) -> SpeechResult:
            work = SpeechWork(prepared.request, generation.progress, cancelled)
            result = self.fleet.hooks.synthesize_speech(adapter, work)
            if result is None:
                raise WerkError(ErrorCode.UNSUPPORTED, f"speech is not supported by backend {adapter.backend}")
            if result.format != prepared.request.response_format or not result.audio:
                owner = self.fleet.plugins.owner_of(adapter)
                raise WerkError(ErrorCode.INTERNAL, f"plugin {owner} answered the speech request wrongly")
            return result

        return run
