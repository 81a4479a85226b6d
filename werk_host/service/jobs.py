"""Jobs: media requests run in the background, their records in the host's job store
(docs/media.md, "Jobs"; werk_host/store/jobs.py holds the records and their contract).

* **Submit** (:meth:`JobService.submit`) validates the whole request first, exactly as the
  synchronous routes do (:meth:`~werk_host.service.media.MediaService.prepare`: the bounds, the
  sampler, image-to-image; :meth:`~werk_host.service.media.MediaService.prepare_speech` for a
  ``kind: speech`` job: the voice, format, language, speed, instructions), then stores the
  exact request and a ``queued`` record owned by the caller, then queues it. A refused request
  leaves no record.
* **Run.** One runner thread per host takes queued jobs in order (the media workers are
  serialized anyway) and runs each through the same :meth:`MediaService.generate` as a
  synchronous request: the owner's gate ticket and a seat on its instance (tried again until
  seated: a queued job waits, it is not refused), progress per step into the record (kept in
  memory; written to ``status.json`` when the status changes), results written before the
  status names them: ``image-<i>.png`` per image, ``speech.<format>`` for speech.
* **Cancel** (:meth:`JobService.cancel`): a queued job becomes ``cancelled`` at once; a
  running one is told to stop (the backend polls at every step) and becomes ``cancelled`` when
  it has; a terminal one is answered as it is.
* **Failure.** A backend error ends the job ``failed`` with the error's code and its public
  message (never raw backend text: the adapter's :class:`~werk_host.errors.WerkError` only;
  anything else is ``internal``). A worker killed mid-job fails that job; the next starts a new
  worker. A full disk while writing results: ``failed``, no result listed.
* **Restart.** Nonterminal records found at start-up are ``failed`` (``JobStore.recover``).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import queue
import threading
from typing import Any, Final

from pydantic import ValidationError

from werk_host.errors import ErrorCode, WerkError, validation_message
from werk_host.protocol.media import ImageJobCreate, ImageRequest, JobCreate, JobError, JobProgress, JobStatus, JobView
from werk_host.protocol.speech import SpeechRequest
from werk_host.service.media import Generation, MediaService, Prepared, PreparedSpeech
from werk_host.service.principals import Principal
from werk_host.store.jobs import JobPurge, JobRecord, JobStore, now_ms

__all__ = ["JobService", "image_request", "request_document", "speech_request"]

log = logging.getLogger(__name__)
PNG: Final = "image/png"
#: How often the runner looks for ``werk jobs cancel`` markers.
WATCH_S: Final = 0.25


def image_request(fields: dict[str, Any], model: str | None) -> ImageRequest:
    """A job's (or a route's) image fields as an :class:`ImageRequest`: ``init_image`` base64
    (a ``data:`` URL prefix allowed), decoded here; every bound checked (``invalid_request``)."""
    doc = dict(fields)
    if model is not None:
        doc["model"] = model
    init = doc.get("init_image")
    if init is not None:
        doc["init_image"] = decode_image(init, "init_image")
    try:
        return ImageRequest.model_validate(doc)
    except ValidationError as err:
        raise WerkError(ErrorCode.INVALID_REQUEST, validation_message(err)) from err


def speech_request(fields: dict[str, Any], model: str | None) -> SpeechRequest:
    """A job's (or a route's) speech fields as a :class:`SpeechRequest`, every bound checked
    (``invalid_request``)."""
    doc = dict(fields)
    if model is not None:
        doc["model"] = model
    try:
        return SpeechRequest.model_validate(doc)
    except ValidationError as err:
        raise WerkError(ErrorCode.INVALID_REQUEST, validation_message(err)) from err


def decode_image(value: object, name: str) -> bytes:
    """Base64 image data (optionally a ``data:image/...;base64,`` URL) as bytes, bounded."""
    from werk_host.protocol.media import MAX_INIT_IMAGE_BYTES

    if not isinstance(value, str):
        raise WerkError(ErrorCode.INVALID_REQUEST, f"{name} must be a base64 string")
    if value.startswith("data:"):
        value = value.partition(",")[2]
    if len(value) > (MAX_INIT_IMAGE_BYTES * 4) // 3 + 4:
        raise WerkError(ErrorCode.INVALID_REQUEST, f"{name} is larger than {MAX_INIT_IMAGE_BYTES >> 20} MiB")
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as err:
        raise WerkError(ErrorCode.INVALID_REQUEST, f"{name} is not valid base64") from err
    if not data:
        raise WerkError(ErrorCode.INVALID_REQUEST, f"{name} is empty")
    return data


def request_document(request: ImageRequest) -> dict[str, Any]:
    """``request`` as JSON (its ``init_image`` base64), for the job record."""
    doc = request.model_dump(mode="python", exclude={"init_image"})
    if request.init_image is not None:
        doc["init_image"] = base64.b64encode(request.init_image).decode()
    return doc


class JobService:
    """Jobs over one :class:`JobStore` and the host's :class:`MediaService` (module docstring)."""

    def __init__(self, store: JobStore, media: MediaService) -> None:
        self.store = store
        self.media = media
        self._queue: queue.Queue[tuple[str, Principal, Prepared | PreparedSpeech] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._live: dict[str, Generation] = {}
        self._stopping = threading.Event()
        self.recovered = store.recover()
        self._runner = threading.Thread(target=self._run, name="werk-jobs", daemon=True)
        self._runner.start()
        self._watcher = threading.Thread(target=self._watch, name="werk-jobs-cancel", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        """Cancel the live jobs ``werk jobs cancel`` marked (werk_host/store/jobs.py), every
        :data:`WATCH_S`."""
        while not self._stopping.wait(WATCH_S):
            with self._lock:
                live = list(self._live.items())
            for job_id, generation in live:
                if not generation.cancel.is_set() and self.store.cancel_requested(job_id):
                    self.cancel(None, job_id)

    def close(self) -> None:
        self._stopping.set()
        with self._lock:
            for generation in self._live.values():
                generation.cancel.set()
        self._queue.put(None)
        self._runner.join(timeout=10)
        self._watcher.join(timeout=5)
        self.store.release()

    # -- the protocol's operations -----------------------------------------------------------
    def submit(self, principal: Principal, create: JobCreate) -> JobView:
        """``POST /werk/v1/jobs`` (module docstring)."""
        job = create.root
        fields = job.input.model_dump(exclude_none=True)
        if isinstance(job, ImageJobCreate):
            return self.submit_image(principal, job.model, fields)
        return self.submit_speech(principal, job.model, fields)

    def submit_image(self, principal: Principal, model: str | None, fields: dict[str, Any]) -> JobView:
        """A ``kind: image`` job of ``fields`` (an :class:`ImageRequest`'s, ``init_image``
        base64) for ``model``, every route's one way in (module docstring)."""
        request = image_request(fields, model)
        prepared = self.media.prepare(request)
        document = {"kind": "image", "request": request_document(prepared.request)}
        generation = Generation(principal.id, prepared.model)
        generation.steps = prepared.request.steps or 0
        return self._queued(principal, prepared, document, generation)

    def submit_speech(self, principal: Principal, model: str | None, fields: dict[str, Any]) -> JobView:
        """A ``kind: speech`` job of ``fields`` (a :class:`SpeechRequest`'s) for ``model``."""
        prepared = self.media.prepare_speech(speech_request(fields, model))
        document = {"kind": "speech", "request": prepared.request.model_dump(mode="json")}
        return self._queued(principal, prepared, document, Generation(principal.id, prepared.model, kind="speech"))

    def _queued(
        self,
        principal: Principal,
        prepared: Prepared | PreparedSpeech,
        document: dict[str, Any],
        generation: Generation,
    ) -> JobView:
        """The job's exact request stored with a ``queued`` record owned by ``principal``, then
        queued (module docstring, "Submit")."""
        record = self.store.create(principal.id, generation.kind, prepared.model, json.dumps(document).encode())
        generation.job_id = record.id
        with self._lock:
            self._live[record.id] = generation
        self._queue.put((record.id, principal, prepared))
        return self._view(record)

    def get(self, principal: Principal, job_id: str) -> JobView:
        return self._view(self.store.get(principal.id, job_id))

    def listing(self, principal: Principal | None) -> list[JobView]:
        return [self._view(r) for r in self.store.listing(None if principal is None else principal.id)]

    def result(self, principal: Principal, job_id: str, name: str) -> tuple[bytes, str]:
        return self.store.result(principal.id, job_id, name)

    def cancel(self, principal: Principal | None, job_id: str) -> JobView:
        record = self.store.get(None if principal is None else principal.id, job_id)
        if record.status is JobStatus.QUEUED:
            record.status, record.finished_unix_ms = JobStatus.CANCELLED, now_ms()
            self.store.update(record)
        with self._lock:
            generation = self._live.get(job_id)
        if generation is not None:
            generation.cancel.set()
        return self._view(self.store.get(None, job_id))

    def purge(self, principal: Principal | None, ids: tuple[str, ...] = ()) -> JobPurge:
        return self.store.purge(None if principal is None else principal.id, ids=ids)

    def _view(self, record: JobRecord) -> JobView:
        with self._lock:
            generation = self._live.get(record.id)
        if generation is not None and record.status is JobStatus.RUNNING:
            record.progress = JobProgress(step=generation.step, steps=generation.steps, fraction=generation.fraction)
        return record.view()

    # -- the runner ----------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            job_id, principal, prepared = item
            try:
                self._one(job_id, principal, prepared)
            except Exception:  # the runner never dies: the job is failed, the next one runs
                log.exception("job %s: unexpected error", job_id)
                self._finish(job_id, JobStatus.FAILED, _failure(job_id, WerkError(ErrorCode.INTERNAL, "unexpected")))
            finally:
                with self._lock:
                    self._live.pop(job_id, None)

    def _one(self, job_id: str, principal: Principal, prepared: Prepared | PreparedSpeech) -> None:
        record = self.store.get(None, job_id)
        with self._lock:
            generation = self._live.get(job_id)
        if record.status is not JobStatus.QUEUED or generation is None:
            return  # cancelled while queued
        record.status, record.started_unix_ms = JobStatus.RUNNING, now_ms()
        self.store.update(record)

        def wait() -> bool:  # the runner's "keep trying" for a seat
            return not self._stopping.is_set()

        files: list[tuple[str, str, bytes]]
        try:
            if isinstance(prepared, PreparedSpeech):
                speech = self.media.speak(principal, prepared, generation=generation, wait_for_seat=wait)
                files = [(f"speech.{speech.format}", speech.content_type, speech.audio)]
                info = {**speech.info, "seed": prepared.request.seed, "sample_rate": speech.sample_rate}
                info["seconds"] = speech.seconds
            else:
                result = self.media.generate(principal, prepared, generation=generation, wait_for_seat=wait)
                files = [(f"image-{i}.png", PNG, data) for i, data in enumerate(result.images)]
                info = {**result.info, "seeds": list(result.seeds)}
        except WerkError as err:
            if err.code is ErrorCode.CONFLICT and generation.cancel.is_set():
                self._finish(job_id, JobStatus.CANCELLED, None)
            else:
                self._finish(job_id, JobStatus.FAILED, _failure(job_id, err))
            return
        record = self.store.get(None, job_id)
        try:
            saved = self.store.save_results(record, files)
        except OSError as err:
            log.warning("job %s: its results could not be written (%s)", job_id, type(err).__name__)
            message = "the job's results could not be written (the disk is full or unwritable)"
            self._finish(job_id, JobStatus.FAILED, JobError(code="resource_exhausted", message=message))
            return
        record.results = saved
        record.info = info
        record.progress = JobProgress(step=generation.steps, steps=generation.steps, fraction=1.0)
        record.status, record.finished_unix_ms = JobStatus.SUCCEEDED, now_ms()
        self.store.update(record)

    def _finish(self, job_id: str, status: JobStatus, error: JobError | None) -> None:
        try:
            record = self.store.get(None, job_id)
        except WerkError:
            return
        if record.status.terminal:
            return
        record.status, record.error, record.finished_unix_ms = status, error, now_ms()
        self.store.update(record)


def _failure(job_id: str, err: WerkError) -> JobError:
    """A failed job's error as every reader sees it (the routes, /ui, ``werk jobs``): the error's
    public message; a redacted one's own text goes to the log only."""
    public = err.public_message()
    if public != err.message:
        log.warning("job %s failed: %s: %s", job_id, err.code.value, err.message)
    return JobError(code=err.code.value, message=public)
