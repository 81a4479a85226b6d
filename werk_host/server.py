"""Assembling a host (plugins, service, app) and serving it under waitress.

:func:`serve` (``werk serve``) binds its listen address before anything else: a taken or
unusable address raises :class:`~werk_host.serving.AddressError` with no backend started, no
model loaded and nothing logged (docs/operations.md, "Start-up"). Only then are the plugins
loaded and the profile deployed; requests that arrive meanwhile wait in the listen backlog until
the host is ready.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from werk_host.backends import launch
from werk_host.backends.child import SPAWNS
from werk_host.config import HostConfig, ServerLimits
from werk_host.deployments.registry import profile_for
from werk_host.logs import WAITRESS_QUEUE_LOGGER, QueueDepthLog
from werk_host.memory import HostMemorySource, MemoryManager, NvmlAcceleratorSource
from werk_host.paths import ensure_private_dir
from werk_host.pluginhost import PluginHost
from werk_host.protocol.media import MAX_MEDIA_REQUEST_BYTES
from werk_host.service.embeddings import EmbeddingService
from werk_host.service.fleet import Fleet
from werk_host.service.gate import InferenceGate, gate_limits
from werk_host.service.inference import InferenceService
from werk_host.service.jobs import JobService
from werk_host.service.local import LocalControlService
from werk_host.service.media import MediaService
from werk_host.service.principals import Authenticator, load_or_create_namespace_secret
from werk_host.serving import create_server, raise_descriptor_limit
from werk_host.store import StateStore
from werk_host.store.jobs import JobStore, jobs_root

if TYPE_CHECKING:
    import falcon

log = logging.getLogger("werk_host.server")


@dataclass
class Host:
    """A fully wired host: call :meth:`close` to stop backend processes."""

    config: HostConfig
    plugins: PluginHost
    fleet: Fleet
    service: LocalControlService
    auth: Authenticator
    app: falcon.App[Any, Any]
    media: MediaService
    jobs: JobService

    def close(self) -> None:
        _close(self.fleet, self.service, self.jobs)


def _close(fleet: Fleet, service: LocalControlService, jobs: JobService) -> None:
    jobs.close()  # running jobs are told to stop first (docs/media.md, "Jobs")
    fleet.close()
    service.prompt_caches.close()  # commits in flight finish (bounded): docs/prompt-cache.md


def _build_app(
    config: HostConfig,
    service: LocalControlService,
    auth: Authenticator,
    inference: InferenceService,
    fleet: Fleet,
    media: MediaService,
    jobs: JobService,
    embedder: EmbeddingService,
    *,
    after: int,
    deployed: threading.Event,
) -> falcon.App[Any, Any]:
    """The falcon app: imported and built once a backend child was spawned after the count
    ``after``, or once ``deployed`` is set: off the path to the first backend's spawn
    (docs/operations.md, "Start-up"). Its OpenAPI document is made when first asked for."""
    SPAWNS.wait_past(after, deployed)
    from werk_host.http.app import create_app
    from werk_host.http.browser import BrowserPolicy

    browser = BrowserPolicy(config.host, config.allowed_hosts, config.allowed_origins)
    return create_app(
        service,
        auth,
        openapi=_openapi,
        inference=inference,
        fleet=fleet,
        browser=browser,
        media=media,
        jobs=jobs,
        embedder=embedder,
    )


def _openapi() -> dict[str, Any]:
    from werk_host.openapi import build_openapi

    return build_openapi()


def build_host(
    config: HostConfig,
    *,
    plugins: PluginHost | None = None,
    memory: MemoryManager | None = None,
    load_entry_points: bool = True,
) -> Host:
    """Wire plugins → deployment fleet → service → app, and deploy the configured profile (or the
    ``--model`` shorthand): preloaded instances start now, the others on first use. The app is
    built on a second thread while the profile deploys, so that a preloaded backend is spawned
    before the HTTP layer is imported and loads its model meanwhile (docs/operations.md,
    "Start-up"); an error of either ends the build with nothing left running."""
    ensure_private_dir(config.home)
    if plugins is None:
        plugins = PluginHost()
        if load_entry_points:
            plugins.load_entry_points()
    secret = load_or_create_namespace_secret(config.home)
    auth = Authenticator(config.api_keys, secret, config.operator_api_keys)
    fleet = Fleet(plugins, config)
    memory = memory or MemoryManager(HostMemorySource(), NvmlAcceleratorSource())
    bounds = config.store_bounds  # docs/states.md, "Quotas"
    store = StateStore(
        config.home / "runtime-state" / "v1",
        max_states=bounds.max_states,
        max_bytes=bounds.max_bytes,
        max_states_per_key=bounds.max_states_per_key,
        max_bytes_per_key=bounds.max_bytes_per_key,
    )
    gate = InferenceGate(gate_limits(config.limits))  # docs/operations.md, "Inference concurrency"
    service = LocalControlService(fleet=fleet, auth=auth, store=store, memory=memory, cursor_secret=secret, gate=gate)
    inference = InferenceService(fleet, service.chat_stats, gate, service.prompt_caches)
    media = MediaService(fleet, gate)  # docs/media.md
    embedder = EmbeddingService(fleet, service.chat_stats, gate)  # docs/embeddings.md
    jobs = JobService(JobStore(jobs_root(config.home)), media)  # nonterminal records: failed
    deployed = threading.Event()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="werk-app") as builder:
        # a child prestarted from the remembered launch is already loading its model
        after = SPAWNS.count - launch.loading()
        app = builder.submit(
            _build_app, config, service, auth, inference, fleet, media, jobs, embedder, after=after, deployed=deployed
        )
        try:
            try:
                profile = profile_for(config)
                if profile is not None:
                    fleet.deploy(profile)
            finally:
                launch.settle()
                deployed.set()
            # preloaded instances start warm: their prompt caches' warm start finishes (bounded)
            # before the host serves (docs/prompt-cache.md, "Warm start")
            service.prompt_caches.wait()
            return Host(config, plugins, fleet, service, auth, app.result(), media, jobs)
        except BaseException:
            _close(fleet, service, jobs)
            raise


class _Stop(SystemExit):
    """Raised by the signal handler; waitress's loop treats SystemExit as "stop serving"."""


ExcInfo = tuple[type[BaseException], BaseException, TracebackType] | tuple[None, None, None] | None
#: Streamed media types whose status and headers go out before the first body byte.
STREAMED_TYPES = ("text/event-stream", "application/x-ndjson")


def stream_headers_first(app: WSGIApplication) -> WSGIApplication:
    """``app`` sending a stream's status and headers as soon as it returns, not with the first
    event (docs/operations.md, "Streaming").

    A response with no ``Content-Length`` and a :data:`STREAMED_TYPES` content type gets one
    empty ``write`` on the server's write callable once the app has returned: under waitress
    that transmits the headers, while an empty chunk yielded by the iterable would not (PEP
    3333). A relayed stream thus reaches its client the way the backend's own headers reached
    Werk: before the first token, so the client parses them while the backend computes. If that
    write fails (the client left), the app's iterable is closed (its upstream request with it)
    before the error propagates."""

    def wrapped(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        started: list[tuple[Callable[[bytes], object], list[tuple[str, str]]]] = []

        def starting(
            status: str, headers: list[tuple[str, str]], exc_info: ExcInfo = None
        ) -> Callable[[bytes], object]:
            write = start_response(status, headers, exc_info)
            started.append((write, headers))
            return write

        body = app(environ, starting)
        if started and _streamed(started[-1][1]):
            try:
                started[-1][0](b"")
            except BaseException:
                close = getattr(body, "close", None)
                if close is not None:
                    close()
                raise
        return body

    return wrapped


def _streamed(headers: list[tuple[str, str]]) -> bool:
    streamed = False
    for name, value in headers:
        lowered = name.lower()
        if lowered == "content-length":
            return False
        if lowered == "content-type":
            streamed = value.startswith(STREAMED_TYPES)
    return streamed


def make_server(app: WSGIApplication, host: str, port: int, limits: ServerLimits) -> Any:
    """The waitress server ``werk serve`` runs (tests serve through it too); ``port`` 0 = any.
    It serves ``app`` through :func:`stream_headers_first`, with the request read deadline,
    connection headroom and shaped parse errors of :mod:`werk_host.serving`."""
    server = create_server(
        stream_headers_first(app),
        request_read_timeout=limits.request_read_timeout,
        host=host,
        port=port,
        threads=limits.threads,
        connection_limit=limits.connection_limit,
        channel_timeout=limits.channel_timeout,
        cleanup_interval=limits.cleanup_interval,
        asyncore_use_poll=True,  # select() cannot watch descriptors past FD_SETSIZE (1024)
        max_request_body_size=MAX_MEDIA_REQUEST_BYTES,  # the largest route bound (docs/media.md)
        ident="werk-host",
        # keep reading a connection while its request runs, so that a client that leaves
        # is noticed (waitress.client_disconnected) and its inference request cancelled
        channel_request_lookahead=1,
    )
    server.task_dispatcher.queue_logger = QueueDepthLog(logging.getLogger(WAITRESS_QUEUE_LOGGER))
    return server


class _DeferredApp:
    """The WSGI app a server bound before its host was built serves: ``app`` once set (the
    server's loop only runs after that; until then a request would get a 503)."""

    def __init__(self) -> None:
        self.app: WSGIApplication | None = None

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if self.app is None:
            start_response("503 Service Unavailable", [("Content-Type", "text/plain"), ("Retry-After", "1")])
            return [b"starting\n"]
        return self.app(environ, start_response)


#: Called once ``werk serve`` listens with its host, and the bound host and port.
OnReady = Callable[[Host, str, int], None]


def serve(config: HostConfig, on_ready: OnReady | None = None) -> int:
    """Run ``werk serve`` until SIGINT/SIGTERM/SIGHUP; always stops backend processes.

    The address is bound first (module docstring): :class:`~werk_host.serving.AddressError`
    propagates before anything has started. ``on_ready`` runs once the host listens and is
    ready, after the ``listening`` line on stdout."""
    raise_descriptor_limit(config.limits.connection_limit + 256)  # + backends, files, backlog
    front = _DeferredApp()
    server = make_server(front, config.host, config.port, config.limits)  # AddressError: nothing started
    received: list[int] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        raise _Stop(0)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    host: Host | None = None
    ran = False
    try:
        host = build_host(config)
        front.app = host.app
        if not host.auth.enabled:
            log.warning(
                "NO API KEYS CONFIGURED: every request is the shared local principal; "
                "this server is not an isolation boundary. Use --api-key-file or WERK_API_KEYS."
            )
        bound = _bound(server, config)
        log.info("serving Werk Protocol 1.0 on http://%s:%s", bound[0], bound[1])
        print(json.dumps({"event": "listening", "host": bound[0], "port": bound[1]}), flush=True)
        if on_ready is not None:
            on_ready(host, bound[0], bound[1])
        ran = True
        server.run()  # returns once the handler's SystemExit reaches waitress's loop
    except _Stop:
        pass
    finally:
        if received:
            log.info("received signal %s; shutting down", received[0])
        started = time.monotonic()
        server.close()
        if not ran:  # nothing was served: its idle worker threads end at once
            server.task_dispatcher.shutdown()
        built = host is not None
        if host is not None:
            host.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if built or received:  # a start refused (a bad profile) is the caller's one line alone
            log.info("stopped in %.2fs", time.monotonic() - started)
    return 0


def _bound(server: Any, config: HostConfig) -> tuple[str, int]:
    """The host and port ``server`` listens on (its first address when it has several)."""
    if hasattr(server, "getsockname"):
        host, port = server.getsockname()[:2]
        return str(host), int(port)
    listening = getattr(server, "effective_listen", None)
    if listening:
        return str(listening[0][0]), int(listening[0][1])
    return config.host, config.port
