"""One deployment instance: a concrete adapter for one model, started lazily, stopped when idle.

Lifecycle (docs/deployments.md, "Lifecycle"): ``cold`` (no adapter) → ``starting`` (the
factory is creating it; concurrent first requests wait for this one start) → ``ready`` →
``stopping`` → ``cold`` again after ``keep_alive`` idle time. That idle time is the profile's,
unless a request asked for another one (:meth:`Instance.hold`, Ollama's per-request
``keep_alive``, docs/compat.md): then the requested time decides until the instance stops or
another request asks again. Residency is the operator's (docs/deployments.md, "Residency"): a
request of a principal that is not an operator is clamped into the profile's bounds
(:meth:`~werk_host.deployments.profile.InstanceSpec.client_hold`), so it never shortens the
profile's ``keep_alive``, and it never replaces an operator's setting. A start that raises leaves the
instance ``failed`` with a public, redacted reason; requests within :data:`RETRY_AFTER_S` get
that reason as a retryable 503 at once, later ones try again. One instance's failure never
touches another's.

Every start is admitted by the deployment set's residency first (:class:`Room`,
werk_host/deployments/residency.py; docs/deployments.md, "Residency limits"): it makes room by
unloading idle instances through :meth:`Instance.stop` — the one stop path, which closes the
adapter — or refuses the start with the reason. A request waits for a start (its own or
another's) at most the profile's ``load_timeout``, then gets a retryable 503 with
``Retry-After``. Each instance keeps a bounded tail of its own lifecycle events
(:meth:`Instance.events`: loading, ready, unloaded and why, failed with the public reason) for
``GET /werk/v1/deployments/{id}/logs``; nothing in it is a backend's raw output.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Protocol

from werk_host.config import HostConfig
from werk_host.deployments.durations import too_long
from werk_host.deployments.profile import InstanceSpec
from werk_host.errors import ErrorCode, WerkError
from werk_host.filecache import ModelFiles, ReleaseMode, ReleaseReport, release_enabled, release_mode
from werk_host.models import ModelManifest
from werk_host.pluginhost import PluginHost
from werk_host.protocol.deployments import FileCacheFile, InstanceFileCache, InstanceStateName
from werk_host.seam import Adapter, AdapterFactory

log = logging.getLogger(__name__)

#: How long a failed start is answered from its recorded reason before the next try.
RETRY_AFTER_S = 5.0


#: Lifecycle events an instance keeps for its log tail.
EVENTS_KEPT = 200


def _now_ms() -> int:
    return int(time.time() * 1000)


class Room(Protocol):
    """What admits an instance's starts (werk_host/deployments/residency.py)."""

    #: how long a request waits for a start before a retryable 503
    load_timeout_s: float

    def admit(self, instance: Instance, deadline: float) -> None:
        """Make room for ``instance`` by ``deadline`` (a :func:`time.monotonic` reading), or raise."""

    def settled(self, instance: Instance) -> None:
        """``instance``'s admitted start ended (ready or failed)."""

    def changed(self) -> None:
        """An instance changed state or in-flight count; waiting admissions look again."""

    def timed_out(self, instance: Instance, waited_s: float) -> WerkError:
        """The retryable 503 of a request that waited ``waited_s`` for ``instance``."""


_STATUS = {
    InstanceStateName.COLD: "unloaded",
    InstanceStateName.STARTING: "loading",
    InstanceStateName.READY: "ready",
    InstanceStateName.STOPPING: "unloading",
    InstanceStateName.FAILED: "failed",
}


@dataclass(frozen=True)
class InstanceView:
    """A consistent snapshot of an instance for inventory, metrics and routing decisions."""

    id: str
    backend: str
    model: str
    state: InstanceStateName
    in_flight: int
    started_unix_ms: int | None
    last_used_unix_ms: int | None
    error: str | None
    #: the idle time after which the instance stops (the profile's, or what a request asked
    #: for); ``None``: never stopped for idleness
    keep_alive_s: float | None
    #: when ``state`` last changed
    since_unix_ms: int | None = None
    #: how long the last successful start took
    load_s: float | None = None
    #: never unloaded to make room (the profile's ``pin``, or an operator's pin/unpin)
    pinned: bool = False

    @property
    def status(self) -> str:
        """The residency status the compatibility listings show (``/v1/models``, ``/api/ps``;
        docs/deployments.md, "Inventory"): ``unloaded``, ``loading``, ``ready``, ``unloading`` or
        ``failed``."""
        return _STATUS[self.state]

    @property
    def expires_unix_ms(self) -> int | None:
        """When the idle instance stops if no request comes: last use plus ``keep_alive_s``;
        ``None`` when it is not ready, or never expires."""
        if self.state is not InstanceStateName.READY or self.keep_alive_s is None or self.last_used_unix_ms is None:
            return None
        if too_long(self.keep_alive_s):  # never stored (hold refuses it); an expiry must fit a timestamp
            return None
        return self.last_used_unix_ms + round(self.keep_alive_s * 1000)


class Instance:
    """A deployment instance (see the module docstring). Thread-safe."""

    def __init__(
        self,
        spec: InstanceSpec,
        manifest: ModelManifest,
        factory: AdapterFactory,
        config: HostConfig,
        *,
        room: Room,
        plugins: PluginHost | None = None,
        on_ready: Callable[[Instance, Adapter], None] | None = None,
    ) -> None:
        self.spec = spec
        #: told (outside every lock) each time a start made the instance ready
        self._on_ready = on_ready
        self._plugins = plugins  # each adapter is attached while it lives (docs/architecture.md)
        self.manifest = manifest
        self.factory = factory
        self.config = config
        self._room = room
        # entered directly on the hot paths (a Condition's own ``with`` is a Python-level call);
        # waits and notifications go through the condition over the same lock
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._state = InstanceStateName.COLD
        self._adapter: Adapter | None = None
        self._error: str | None = None
        self._error_code = ErrorCode.UNAVAILABLE
        self._failed_at = 0.0
        self._in_flight = 0
        self._started_ms: int | None = None
        self._last_used_ms: int | None = None
        self._last_used_mono = time.monotonic()
        self._held_s: float | None = None
        self._held_by_operator = False
        self._since_ms = _now_ms()
        self._load_s: float | None = None
        self._pinned = spec.pin
        self._events: deque[str] = deque(maxlen=EVENTS_KEPT)
        # the model-lifetime guard (docs/operations.md, "Model file cache"): leases on the
        # manifest's files while an adapter lives, released after it closed
        self._cache_mode: ReleaseMode | None = None if spec.endpoint is not None else self._mode(spec, config)
        self._cache_release = self._cache_mode is not None and release_enabled(self._cache_mode)
        self._files: ModelFiles | None = None
        self._last_release: ReleaseReport | None = None

    @staticmethod
    def _mode(spec: InstanceSpec, config: HostConfig) -> ReleaseMode:
        try:
            return release_mode(spec.model_cache_release, config.model_cache_release)
        except ValueError as err:  # the CLI and the profile refuse it first; a library caller may not
            log.warning("instance %s: %s; the file cache is kept", spec.id, err)
            return "off"

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def backend(self) -> str:
        return self.factory.backend

    def view(self) -> InstanceView:
        with self._lock:
            return InstanceView(
                self.id,
                self.backend,
                self.manifest.name,
                self._state,
                self._in_flight,
                self._started_ms,
                self._last_used_ms,
                self._error,
                self._keep_alive_locked(),
                self._since_ms,
                self._load_s,
                self._pinned,
            )

    def file_cache(self) -> InstanceFileCache | None:
        """The model files' page-cache guard for the inventory (``None`` for a remote instance)."""
        if self._cache_mode is None:
            return None
        with self._lock:
            files, last = self._files, self._last_release
        return InstanceFileCache(
            mode=self._cache_mode,
            release=self._cache_release,
            leased_files=0 if files is None else files.leased,
            last_release=None if last is None else [FileCacheFile.model_validate(f.as_dict()) for f in last.files],
        )

    def _set_state_locked(self, state: InstanceStateName) -> None:
        self._state = state
        self._since_ms = _now_ms()

    def _event(self, text: str) -> None:
        """Record a lifecycle event for the log tail (public text only: ids, states, reasons)."""
        stamp = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        with self._lock:
            self._events.append(f"{stamp} {text}")

    def events(self, lines: int = EVENTS_KEPT) -> list[str]:
        """The last ``lines`` lifecycle events, oldest first."""
        with self._lock:
            return list(self._events)[-lines:] if lines > 0 else []

    @property
    def pinned(self) -> bool:
        with self._lock:
            return self._pinned

    def pin(self, pinned: bool) -> None:
        """Pin (never unloaded to make room) or unpin the instance; lasts across restarts."""
        with self._lock:
            self._pinned = pinned
        self._event("pinned by an operator" if pinned else "unpinned by an operator")
        self._room.changed()

    def peek(self) -> Adapter | None:
        """The adapter when the instance is ready; ``None`` otherwise. Never starts anything."""
        with self._lock:
            return self._adapter if self._state is InstanceStateName.READY else None

    def down(self) -> bool:
        """Whether routing should skip this instance now (a recent failed start)."""
        with self._lock:
            return self._state is InstanceStateName.FAILED and time.monotonic() - self._failed_at < RETRY_AFTER_S

    # -- start ---------------------------------------------------------------------------
    def use(self, *, enter: bool = False) -> Adapter:
        """The ready adapter, starting the instance first when it is cold (once, however many
        requests arrive together). Raises the recorded failure (503, retryable) while a failed
        start is recent. ``enter``: first count the caller in flight (:meth:`enter`, under the
        same lock), whether or not the start then succeeds; the caller calls :meth:`leave`.
        Waiting for a start (or a stop) and for room lasts at most the room's
        ``load_timeout_s``, then raises its retryable 503."""
        with self._lock:  # ready: every request but the first (no clock read for a wait)
            if self._state is InstanceStateName.READY and self._adapter is not None:
                if enter:
                    self._in_flight += 1
                self._touch_locked()
                return self._adapter
        began = time.monotonic()
        deadline = began + self._room.load_timeout_s
        with self._lock:
            if enter:
                self._in_flight += 1
            while True:
                if self._state is InstanceStateName.READY and self._adapter is not None:
                    self._touch_locked()
                    return self._adapter
                if self._state in (InstanceStateName.STARTING, InstanceStateName.STOPPING):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise self._room.timed_out(self, time.monotonic() - began)
                    self._cond.wait(remaining)
                    continue
                if self._state is InstanceStateName.FAILED and time.monotonic() - self._failed_at < RETRY_AFTER_S:
                    raise self._failure_locked()
                self._set_state_locked(InstanceStateName.STARTING)
                break
        self._event("loading")
        try:
            self._room.admit(self, deadline)
        except WerkError as err:
            if err.code is not ErrorCode.RESOURCE_EXHAUSTED:
                self._not_admitted(err.message)
                raise
            # a refusal with the reason: failed, as a start that cannot fit, but not replayed for
            # RETRY_AFTER_S: residency changes whenever another instance does
            self._start_failed(err, replay=False)
            self._room.changed()
            with self._lock:
                raise self._failure_locked() from err
        except BaseException:
            self._not_admitted("interrupted")
            raise
        return self._start(time.monotonic())

    def _not_admitted(self, why: str) -> None:
        """Back to cold after a wait for room that ended without a start (timed out, queue full)."""
        with self._lock:
            self._set_state_locked(InstanceStateName.COLD)
            self._cond.notify_all()
        self._event(f"not loaded: {why}")
        self._room.changed()

    def _start(self, began: float) -> Adapter:
        """Create the adapter of an admitted start."""
        adapter: Adapter | None = None
        if self._cache_mode is not None:
            files = ModelFiles.lease(f.path for f in self.manifest.files)
            with self._lock:
                self._files = files
        try:
            # the adapter sees its instance's own switch (a plugin's own files beyond the manifest)
            config = self.config
            if self._cache_mode is not None and config.model_cache_release != self._cache_mode:
                config = replace(config, model_cache_release=self._cache_mode)
            adapter = self.factory.create(config, self.manifest)
            if self._plugins is not None:
                self._plugins.attach(adapter, self.factory)
        except BaseException as err:
            if adapter is not None:
                self._close(adapter)
            else:
                self._release_files()
            self._start_failed(err)
            self._room.settled(self)
            with self._lock:
                raise self._failure_locked() from err
        with self._lock:
            self._adapter = adapter
            self._set_state_locked(InstanceStateName.READY)
            self._error = None
            self._started_ms = _now_ms()
            self._load_s = time.monotonic() - began
            self._touch_locked()
            self._cond.notify_all()
        self._room.settled(self)
        self._event(f"ready in {self._load_s:.2f} s")
        log.info("instance %s ready (%s, model %s)", self.id, self.backend, self.manifest.name)
        if self._on_ready is not None:
            try:
                self._on_ready(self, adapter)
            except Exception:
                log.warning("instance %s: a ready listener failed", self.id, exc_info=True)
        return adapter

    def _start_failed(self, err: BaseException, *, replay: bool = True) -> None:
        log.error("instance %s failed to start: %s", self.id, err, exc_info=not isinstance(err, WerkError))
        with self._lock:
            self._set_state_locked(InstanceStateName.FAILED)
            self._failed_at = time.monotonic() if replay else -math.inf
            self._error = self._public_reason(err)
            exhausted = isinstance(err, WerkError) and err.code is ErrorCode.RESOURCE_EXHAUSTED
            self._error_code = ErrorCode.RESOURCE_EXHAUSTED if exhausted else ErrorCode.UNAVAILABLE
            self._cond.notify_all()
        self._event(f"failed: {self._error}")

    def _public_reason(self, err: BaseException) -> str:
        if isinstance(err, WerkError) and err.code is ErrorCode.RESOURCE_EXHAUSTED:
            return err.message  # the host's own text: sizes, no paths
        return f"the {self.backend} backend failed to start instance {self.id}; the server log has the details"

    def _failure_locked(self) -> WerkError:
        """The recorded failure: ``unavailable``, or ``resource_exhausted`` when the memory guard
        refused the start; retryable either way."""
        return WerkError(self._error_code, self._error or f"instance {self.id} is unavailable", retryable=True)

    # -- use accounting ------------------------------------------------------------------
    def _touch_locked(self) -> None:
        self._last_used_ms = int(time.time() * 1000)  # _now_ms(), twice per request
        self._last_used_mono = time.monotonic()

    def enter(self) -> None:
        with self._lock:
            self._in_flight += 1
            self._touch_locked()

    def leave(self) -> None:
        with self._lock:
            self._in_flight = max(self._in_flight - 1, 0)
            self._touch_locked()
            idle = self._in_flight == 0
            # _keep_alive_locked() == 0: neither None nor an infinite hold equals 0
            idle_now = idle and (self.spec.keep_alive_s if self._held_s is None else self._held_s) == 0
        if idle_now:
            self.stop("keep_alive 0")
        elif idle:
            self._room.changed()  # an admission waiting for this instance to go idle looks again

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    # -- residency -----------------------------------------------------------------------
    def hold(self, seconds: float | None, *, operator: bool = True) -> None:
        """Keep the ready instance for ``seconds`` of idle time from now on, instead of the
        profile's ``keep_alive`` (``math.inf``: never stop it for idleness); ``None`` returns to
        the profile's. The idle clock restarts now. The request's setting lasts until the
        instance stops (a later start uses the profile's again) or another call replaces it.
        Nothing happens to an instance that is not ready.

        Without ``operator`` (a client's request) ``seconds`` is clamped into the profile's
        bounds (:meth:`InstanceSpec.client_hold`), and nothing changes while an operator's
        setting is in effect. Raises :class:`ValueError` for a negative, ``nan`` or finite value
        above :data:`~werk_host.deployments.durations.MAX_DURATION_S`."""
        if seconds is not None and (math.isnan(seconds) or seconds < 0 or too_long(seconds)):
            raise ValueError("a keep_alive is 0 to MAX_DURATION_S seconds, or math.inf")
        with self._lock:
            if self._state is not InstanceStateName.READY:
                return
            if not operator:
                if self._held_by_operator:
                    self._touch_locked()
                    return
                seconds = None if seconds is None else self.spec.client_hold(seconds)
            self._held_s = seconds
            self._held_by_operator = operator and seconds is not None
            self._touch_locked()

    @property
    def keep_alive_s(self) -> float | None:
        """The idle time after which the instance stops now (``None``: never): what a request
        asked for (:meth:`hold`), else the profile's."""
        with self._lock:
            return self._keep_alive_locked()

    def _keep_alive_locked(self) -> float | None:
        keep = self.spec.keep_alive_s if self._held_s is None else self._held_s
        return None if keep is None or math.isinf(keep) else keep

    @property
    def last_used(self) -> float:
        """The :func:`time.monotonic` reading of the last request's start or end (of the
        instance's creation before any): orders uses a millisecond clock cannot tell apart."""
        with self._lock:
            return self._last_used_mono

    # -- stop ----------------------------------------------------------------------------
    def idle_for(self, now: float | None = None) -> float | None:
        """Seconds since the last request while ready and idle, else ``None``; ``now`` is a
        :func:`time.monotonic` reading (default: the current one)."""
        with self._lock:
            if self._state is not InstanceStateName.READY or self._in_flight:
                return None
            return (time.monotonic() if now is None else now) - self._last_used_mono

    def stop_if_idle(self, now: float | None = None) -> bool:
        """Stop the instance when it has been idle, as of ``now`` (a :func:`time.monotonic`
        reading, default the current one), at least its :attr:`keep_alive_s`."""
        keep = self.keep_alive_s
        idle = self.idle_for(now)
        if keep is None or idle is None or idle < keep:
            return False
        return self.stop(f"idle for {idle:.0f} s (keep_alive {keep:g} s)")

    def stop(self, why: str, *, keep: Callable[[], bool] | None = None) -> bool:
        """Close the adapter (its processes stop) and go cold; ``False`` when it was not ready,
        requests are in flight, or ``keep()`` (asked under the instance's lock, so no request
        enters in between; e.g. "live handoffs") says to keep it. This is the one stop path:
        keep-alive, unloads and residency evictions all come here."""
        with self._lock:
            if self._state is not InstanceStateName.READY or self._in_flight or (keep is not None and keep()):
                return False
            adapter, self._adapter = self._adapter, None
            self._set_state_locked(InstanceStateName.STOPPING)
        try:
            if adapter is not None:
                self._close(adapter)
        except Exception:
            log.warning("instance %s did not close cleanly", self.id, exc_info=True)
        finally:
            with self._lock:
                self._set_state_locked(InstanceStateName.COLD)
                self._started_ms = None
                self._held_s = None
                self._held_by_operator = False
                self._cond.notify_all()
            self._room.changed()
        self._event(f"unloaded: {why}")
        log.info("instance %s stopped: %s", self.id, why)
        return True

    def close(self) -> None:
        """Stop regardless of requests in flight (server shutdown)."""
        with self._lock:
            adapter, self._adapter = self._adapter, None
            self._set_state_locked(InstanceStateName.COLD)
            self._held_s = None
            self._held_by_operator = False
            self._cond.notify_all()
        if adapter is not None:
            self._close(adapter)

    def _close(self, adapter: Adapter) -> None:
        try:
            adapter.close()
        finally:
            if self._plugins is not None:
                self._plugins.detach(adapter)
            self._release_files()

    def _release_files(self) -> None:
        """After the adapter closed (its processes reaped): the guard's release, logged."""
        with self._lock:
            files, self._files = self._files, None
        if files is None or self._cache_mode is None:
            return
        try:
            report = files.release(advise=self._cache_release)
        except OSError:
            log.warning("instance %s: the model files' release failed", self.id, exc_info=True)
            return
        with self._lock:
            self._last_release = report
        self._event(report.summary())
        log.info("instance %s: %s", self.id, report.summary())
