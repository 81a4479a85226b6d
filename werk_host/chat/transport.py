"""The two ways ``werk chat``/``werk run`` reach a model (docs/chat.md, "Local and --server").

Both speak the same wire, an OpenAI ``/v1/chat/completions`` event stream, and return it as an
:class:`~werk_host.seam.InferenceResponse` (status, streamed body, ``close`` to cancel):

* :class:`LocalTransport` starts the model's backend in this process through the plugin seam
  ``werk serve`` uses (:class:`~werk_host.service.fleet.Fleet` over a one-instance
  deployment, admission by :class:`~werk_host.service.inference.InferenceService`, hooks through
  :class:`~werk_host.hooks.BackendHooks`). It is the only transport that can offer native
  session slot (``werk_session_slot``). :meth:`LocalTransport.close` stops what it
  started.
* :class:`RemoteTransport` posts to a running ``werk serve`` (``--server URL``, bearer key from
  ``WERK_API_KEY``); that server's backend keeps its live prefix cache, which this client
  neither controls nor verifies.

Failures are :class:`~werk_host.errors.WerkError` with a one-line public message.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Final, Protocol

from werk_host.backends import launch
from werk_host.backends.relay import ClientGone
from werk_host.chat.seam import SessionSlot
from werk_host.chat.stream import error_message, one_line
from werk_host.client.errors import WerkClientError
from werk_host.client.transport import Endpoint, parse_base_url
from werk_host.config import HostConfig
from werk_host.deployments.profile import DeploymentProfile, ProfileError, profile_from_models
from werk_host.deployments.registry import DeploymentSet
from werk_host.errors import ErrorCode, WerkError
from werk_host.hooks import needed
from werk_host.models import ModelManifest, ModelRegistry
from werk_host.pluginhost import PluginHost
from werk_host.seam import Adapter, InferenceResponse, JsonObject, client_disconnected
from werk_host.service.counters import ChatStats
from werk_host.service.fleet import Fleet
from werk_host.service.inference import InferenceService, sanitized_error

#: Bytes of an error answer read for its message.
MAX_ERROR_BYTES: Final = 64 << 10
READ_CHUNK: Final = 16 << 10
#: What a one-model profile's errors start with ("--model[0]: instance x: "), not news to a CLI user.
_PROFILE_PREFIX: Final = re.compile(r"^--model(\[\d+\])?: (instance [^:]+: )?")


class Transport(Protocol):
    """What a chat session needs from the way it reaches the model."""

    #: The model name requests carry.
    model: str
    #: SHA-256 of the model's files when known (local), else empty.
    model_sha256: tuple[str, ...]
    #: One line saying where the model runs.
    description: str

    def open(self, body: JsonObject, *, session: bool) -> InferenceResponse:
        """Start a streamed chat completion (on the native session slot when ``session``)."""
        ...

    def native(self) -> tuple[SessionSlot | None, str]:
        """The backend's session slot, or ``None`` and why there is none."""
        ...

    def diagnostics(self) -> list[str]:
        """Verbose startup facts (preparation time, launch arguments, warmup)."""
        ...

    def close(self) -> None: ...


def _answer_error(status: int, raw: bytes) -> WerkError:
    try:
        doc = json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        doc = None
    message = error_message(doc) or f"the server answered HTTP {status}"
    code = ErrorCode.INVALID_REQUEST if 400 <= status < 500 and status not in (401, 403, 429) else ErrorCode.UNAVAILABLE
    if status in (401, 403):
        code = ErrorCode.UNAUTHORIZED if status == 401 else ErrorCode.FORBIDDEN
    return WerkError(code, message)


@contextlib.contextmanager
def _interruptible() -> Iterator[Callable[[], bool]]:
    """While the body runs, Ctrl-C (SIGINT) only sets a flag, which is what
    :data:`~werk_host.seam.client_disconnected` reports; yields the flag's reader. Outside the
    main thread (no signal handlers there) nothing changes."""
    stopped = threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGINT, lambda signum, frame: stopped.set())
    token = client_disconnected.set(stopped.is_set)
    try:
        yield stopped.is_set
    finally:
        client_disconnected.reset(token)
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


class LocalTransport:
    """The model's backend started in this process for this command (see the module docstring).

    ``plugins`` defaults to every installed ``werk`` plugin (entry points), as for ``werk serve``.
    """

    def __init__(
        self,
        home: Path,
        model: str,
        *,
        backend: str | None = None,
        backend_options: Mapping[str, dict[str, object]] | None = None,
        warmup_tokens: int = 0,
        plugins: PluginHost | None = None,
    ) -> None:
        config = HostConfig(
            home=home,
            backend_options={k: dict(v) for k, v in (backend_options or {}).items()},
            warmup_tokens=warmup_tokens,
        )
        if plugins is None:
            plugins = PluginHost()
            plugins.load_entry_points()
        self.fleet = Fleet(plugins, config)
        registry = ModelRegistry(home)
        try:
            profile = profile_from_models([model], known_model=lambda name: registry.get(name) is not None)
            if backend is not None:
                profile = DeploymentProfile(
                    tuple(replace(spec, backend=backend) for spec in profile.instances), {}, profile.source
                )
            self.fleet.deployments = DeploymentSet(profile, plugins, config)
        except ProfileError as err:
            raise WerkError(ErrorCode.NOT_FOUND, _PROFILE_PREFIX.sub("", str(err))) from err
        instance = self.fleet.deployments.default
        self.manifest: ModelManifest = instance.manifest
        self.model = instance.id
        self.model_sha256 = tuple(f.sha256 for f in self.manifest.files)
        started = time.monotonic()
        try:
            try:
                self.adapter: Adapter = instance.use()
            finally:
                launch.settle()  # the command's one start: its remembered launch is claimed or gone
        except WerkError as err:
            self.fleet.close()
            cause = err.__cause__
            if isinstance(cause, KeyboardInterrupt):
                raise KeyboardInterrupt from None
            if isinstance(cause, WerkError):  # the backend's own reason; its details went to the log
                raise WerkError(cause.code, cause.message.splitlines()[0]) from cause
            raise
        except BaseException:
            self.fleet.close()
            raise
        self.startup_s = time.monotonic() - started
        self.description = f"local {self.adapter.backend} backend, model {self.manifest.name}"
        self.inference = InferenceService(self.fleet, ChatStats())

    def open(self, body: JsonObject, *, session: bool) -> InferenceResponse:
        """Admit ``body`` as ``werk serve`` would and start it. A Ctrl-C before the first byte
        closes the upstream request the way a departed HTTP client does (``client_disconnected``)
        and raises ``KeyboardInterrupt``."""
        with _interruptible() as stopped:
            try:
                response = self._start(body, session=session)
            except ClientGone:
                raise KeyboardInterrupt from None
        if stopped():
            response.close()
            raise KeyboardInterrupt
        return response

    def _start(self, body: JsonObject, *, session: bool) -> InferenceResponse:
        hooks = self.fleet.hooks
        admitted = self.inference.admit_chat(self.adapter, body)
        if session:
            slot, reason = self.native()
            if slot is None:
                raise WerkError(ErrorCode.UNSUPPORTED, reason)
            response = slot.chat(admitted)
        else:
            response = needed(hooks.chat_completion(self.adapter, admitted), "chat completions", self.adapter)
        if response.status >= 400:
            answer = sanitized_error(response)
            raise _answer_error(answer.status, b"".join(answer.body))
        return response

    def native(self) -> tuple[SessionSlot | None, str]:
        try:
            slot = self.fleet.hooks.session_slot(self.adapter, self.manifest.name)
        except WerkError as err:
            return None, err.message
        if slot is None:
            return None, f"the {self.adapter.backend} backend keeps no native session snapshots"
        return slot, ""

    def diagnostics(self) -> list[str]:
        lines = [
            f"preparation: {self.adapter.backend} worker ready in {self.startup_s:.2f} s",
            "cache capability probe: skipped; reuse checked on actual requests",
        ]
        plan = self.fleet.hooks.deployment_plan(self.adapter)
        if plan is not None:
            args = plan.arguments
            lines.append("launch arguments: " + " ".join(args))
            if "--no-warmup" in args:
                warmup = "off (--no-warmup)"
            elif "--warmup" in args:
                warmup = "on (--warmup)"
            else:
                warmup = "the runtime's default (it offers no warmup switch)"
            lines.append(f"native warmup: {warmup}")
        return lines

    def close(self) -> None:
        self.fleet.close()


class RemoteTransport:
    """Requests through a running ``werk serve`` at ``url`` (``http://HOST:PORT``)."""

    def __init__(self, url: str, model: str, *, api_key: str | None, timeout: float = 600.0) -> None:
        try:
            self.endpoint: Endpoint = parse_base_url(url)
        except WerkClientError as err:
            raise WerkError(ErrorCode.INVALID_REQUEST, str(err)) from err
        self.model = model
        self.model_sha256: tuple[str, ...] = ()
        self.description = f"werk serve at {self.endpoint.url}, model {model}"
        self._api_key = api_key
        self._timeout = timeout

    def __repr__(self) -> str:  # never the key
        return f"RemoteTransport({self.endpoint.url!r}, {self.model!r})"

    def open(self, body: JsonObject, *, session: bool) -> InferenceResponse:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        conn = http.client.HTTPConnection(self.endpoint.host, self.endpoint.port, timeout=self._timeout)
        try:
            conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(), headers=headers)
            resp = conn.getresponse()
            if resp.status >= 400:
                raw = resp.read(MAX_ERROR_BYTES)
                raise _answer_error(resp.status, raw)
        except (OSError, http.client.HTTPException) as err:
            conn.close()
            reason = err.strerror if isinstance(err, OSError) and err.strerror else one_line(str(err), 120)
            raise WerkError(
                ErrorCode.UNAVAILABLE, f"cannot reach werk serve at {self.endpoint.url}: {reason.lower()}"
            ) from err
        except BaseException:
            conn.close()
            raise

        def chunks() -> Iterator[bytes]:
            try:
                while chunk := resp.read1(READ_CHUNK):
                    yield chunk
            except (OSError, http.client.HTTPException) as err:
                raise WerkError(ErrorCode.UNAVAILABLE, "the connection to werk serve broke") from err

        return InferenceResponse(resp.status, dict(resp.getheaders()), chunks(), conn.close)

    def native(self) -> tuple[SessionSlot | None, str]:
        return (
            None,
            "the server's backend keeps its own live prefix cache; this client neither controls nor verifies it",
        )

    def diagnostics(self) -> list[str]:
        return [f"server: {self.endpoint.url} (worker placement and threads belong to werk serve)"]

    def close(self) -> None:
        return None


__all__ = ["LocalTransport", "RemoteTransport", "Transport"]
