"""Operators' metrics: ``GET /metrics`` in the Prometheus text format.

Everything is built with ``prometheus_client`` on a per-app :class:`CollectorRegistry` (never
the process-global one), so several hosts in one process keep separate counts. The registry is
made, and ``prometheus_client`` imported, on the first scrape: not at every start
(docs/operations.md, "Start-up").

* :class:`MetricsMiddleware` counts every request and times it in a :class:`RequestTally`,
  labelled by the Falcon URI template of its route (never the raw path, which may carry state
  ids) or ``unmatched``.
  Latency ends when the response headers are ready: for a streamed ``/v1`` response that is
  the time to the first byte, not to the end of the stream.
* :class:`HostCollector` reads, at scrape time, the chat counters per instance from
  :class:`~werk_host.service.counters.ChatStats` (their one source) and a
  :class:`MetricsReading` (handoffs, stored states, instance states, memory).

The metric names and labels are documented in ``docs/operations.md`` ("Metrics").
"""

from __future__ import annotations

import bisect
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

import falcon
from falcon.routing import CompiledRouter

from werk_host.protocol import ChatCounters, MemoryCounters, Pressure, Tier
from werk_host.service.counters import DEFAULT_INSTANCE, ChatStats, MetricsReading

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import Metric

log = logging.getLogger(__name__)

METRICS_PATH: Final = "/metrics"
#: ``instance`` label of a request that selected no instance.
NO_INSTANCE: Final = DEFAULT_INSTANCE
#: ``route`` label of a request no route matched.
UNMATCHED: Final = "unmatched"
#: ``method`` label of a method outside :data:`_METHODS` (keeps the label set bounded).
OTHER_METHOD: Final = "other"
INSTANCE_STATES: Final = ("cold", "starting", "ready", "stopping", "failed")
#: Request latency buckets (seconds): up to the five minutes a long generation may take.
LATENCY_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
#: ``le`` labels of the latency buckets, as ``prometheus_client`` writes them, then ``+Inf``.
_BOUND_LABELS: Final = (*(f"{bound}" for bound in LATENCY_BUCKETS), "+Inf")
#: ChatCounters fields exported as gauges; every other field is a monotonic counter.
_CHAT_GAUGES: Final = frozenset({"requests_active"})
#: MemoryCounters fields that only grow (counters); the others go up and down (gauges).
_MEMORY_TOTALS: Final = frozenset(
    {"completed_demotions", "completed_evictions", "failed_releases", "telemetry_errors", "backend_cleanup_failures"}
)


def _chat_families(chat: ChatStats) -> list[Metric]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    per_instance = chat.per_instance()
    families: list[Metric] = []
    for name in ChatCounters.model_fields:
        family: CounterMetricFamily | GaugeMetricFamily
        if name in _CHAT_GAUGES:
            family = GaugeMetricFamily(f"werk_chat_{name}", f"Chat {name.replace('_', ' ')}", labels=["instance"])
        else:
            family = CounterMetricFamily(f"werk_chat_{name}", f"Chat {name.replace('_', ' ')}", labels=["instance"])
        for instance, counters in sorted(per_instance.items()):
            family.add_metric([instance], getattr(counters, name))
        families.append(family)
    return families


def _reading_families(reading: MetricsReading) -> list[Metric]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    handoffs = GaugeMetricFamily("werk_handoffs_live", "Live prefill-to-decode handoffs", value=reading.handoffs_live)
    states = GaugeMetricFamily("werk_states", "Named stored states per tier", labels=["tier"])
    state_bytes = GaugeMetricFamily("werk_state_bytes", "Payload bytes of the named states per tier", labels=["tier"])
    for tier in sorted({t.value for t in Tier} | set(reading.states) | set(reading.state_bytes)):
        states.add_metric([tier], reading.states.get(tier, 0))
        state_bytes.add_metric([tier], reading.state_bytes.get(tier, 0))
    instances = GaugeMetricFamily(
        "werk_instance_state", "1 for the current state of each instance, 0 otherwise", labels=["instance", "state"]
    )
    for instance, current in sorted(reading.instances.items()):
        for state in (*INSTANCE_STATES, *(() if current in INSTANCE_STATES else (current,))):
            instances.add_metric([instance, state], 1 if state == current else 0)
    memory = reading.memory
    pressure = GaugeMetricFamily(
        "werk_memory_pressure",
        "1 for the current memory pressure of each tier, 0 otherwise",
        labels=["tier", "pressure"],
    )
    for tier, current in (
        ("host", memory.host.pressure),
        ("accelerator", memory.accelerator.pressure),
        ("overall", memory.overall_pressure),
    ):
        for level in Pressure:
            pressure.add_metric([tier, level.value], 1 if level == current else 0)
    cached = GaugeMetricFamily(
        "werk_prompt_cache_bytes", "Payload bytes of the saved prompt caches per instance", labels=["instance"]
    )
    for instance, nbytes in sorted(reading.prompt_cache_bytes.items()):
        cached.add_metric([instance], nbytes)
    families: list[Metric] = [handoffs, states, state_bytes, instances, pressure, cached]
    for name in MemoryCounters.model_fields:
        value = getattr(memory.counters, name)
        help_text = f"Memory manager: {name.replace('_', ' ')}"
        if name in _MEMORY_TOTALS:
            families.append(CounterMetricFamily(f"werk_memory_{name}", help_text, value=value))
        else:
            families.append(GaugeMetricFamily(f"werk_memory_{name}", help_text, value=value))
    return families


class HostCollector:
    """Exports the chat counters and a :class:`MetricsReading`, both read at scrape time.

    A failing reading is logged and its metrics left out of that scrape; the request
    metrics and chat counters are still exported."""

    def __init__(self, chat: ChatStats | None, reading: Callable[[], MetricsReading] | None) -> None:
        self.chat = chat
        self.reading = reading

    def collect(self) -> Iterable[Metric]:
        if self.chat is not None:
            yield from _chat_families(self.chat)
        if self.reading is not None:
            try:
                reading = self.reading()
            except Exception:
                log.warning("metrics reading failed; its metrics are left out of this scrape", exc_info=True)
                return
            yield from _reading_families(reading)


class RequestTally:
    """Request counts and latency histograms per label set, exported at scrape time.

    Every request records here, so recording is one lock and a few dict and list updates (a
    ``prometheus_client`` child takes a lock per value it touches). The label values are bounded:
    instances, route templates, :data:`_METHODS` and statuses."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: (instance, route, method, status) -> [count, created]
        self._requests: dict[tuple[str, str, str, str], list[float]] = {}
        #: (instance, route) -> per-bucket counts (the last one past every bound), sum, created
        self._durations: dict[tuple[str, str], tuple[list[int], list[float]]] = {}

    def record(self, instance: str, route: str, method: str, status: str, elapsed: float) -> None:
        bucket = bisect.bisect_left(LATENCY_BUCKETS, elapsed)  # bounds are inclusive (``le``)
        with self._lock:
            counted = self._requests.get((instance, route, method, status))
            if counted is None:
                self._requests[instance, route, method, status] = [1, time.time()]
            else:
                counted[0] += 1
            timed = self._durations.get((instance, route))
            if timed is None:
                timed = self._durations[instance, route] = ([0] * (len(LATENCY_BUCKETS) + 1), [0.0, time.time()])
            timed[0][bucket] += 1
            timed[1][0] += elapsed

    def collect(self) -> Iterable[Metric]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
        from prometheus_client.samples import Sample

        requests = CounterMetricFamily(
            "werk_http_requests",
            "HTTP requests by instance, route template, method and status",
            labels=["instance", "route", "method", "status"],
        )
        durations = HistogramMetricFamily(
            "werk_http_request_duration_seconds",
            "HTTP request latency to the response headers (first byte of a stream), by instance and route template",
            labels=["instance", "route"],
        )
        with self._lock:
            counts = [(labels, count, created) for labels, (count, created) in self._requests.items()]
            timings = [(labels, list(buckets), sums[0], sums[1]) for labels, (buckets, sums) in self._durations.items()]
        for request_labels, count, created in sorted(counts):
            requests.add_metric(request_labels, count, created=created)
        for route_labels, buckets, total, created in sorted(timings):
            cumulative = list(itertools.accumulate(buckets))
            durations.add_metric(route_labels, list(zip(_BOUND_LABELS, cumulative, strict=True)), total)
            named = dict(zip(("instance", "route"), route_labels, strict=True))
            durations.samples.append(Sample(f"{durations.name}_created", named, created))
        return [requests, durations]


class MetricsMiddleware:
    """Counts and times every request in a :class:`RequestTally`; register it first so that it
    sees every response.

    A request rejected before routing (401, 406, 413) is labelled with the template its path
    would have matched, looked up in ``router``."""

    def __init__(self, tally: RequestTally, router: CompiledRouter) -> None:
        self.tally = tally
        self.router = router

    def _route(self, req: falcon.Request) -> str:
        template = req.uri_template
        if template is None:
            found = self.router.find(req.path)
            template = found[3] if found is not None else None
        return template or UNMATCHED

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        req.context.metrics_started = time.perf_counter()

    def process_response(self, req: falcon.Request, resp: falcon.Response, resource: Any, req_succeeded: bool) -> None:
        started = getattr(req.context, "metrics_started", None)
        if started is None:
            return
        elapsed = time.perf_counter() - started
        instance = str(getattr(req.context, "instance_id", None) or NO_INSTANCE)
        method = req.method if req.method in _METHODS else OTHER_METHOD
        self.tally.record(instance, self._route(req), method, str(resp.status_code), elapsed)


class MetricsResource:
    """``GET /metrics``: the registry in the Prometheus text format."""

    def __init__(self, registry: Callable[[], CollectorRegistry]) -> None:
        self.registry = registry

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        resp.data = generate_latest(self.registry())
        resp.content_type = CONTENT_TYPE_LATEST
        resp.set_header("Cache-Control", "no-store")


class HostMetrics:
    """One app's metrics: its registry, the request middleware, the resource and the router
    the app must route with (``falcon.App(router=metrics.router)``)."""

    def __init__(self, chat: ChatStats | None, reading: Callable[[], MetricsReading] | None) -> None:
        self.router = CompiledRouter()
        self.requests = RequestTally()
        self._collectors = (self.requests, HostCollector(chat, reading))
        self._registry: CollectorRegistry | None = None
        self._lock = threading.Lock()
        self.middleware = MetricsMiddleware(self.requests, self.router)
        self.resource = MetricsResource(lambda: self.registry)

    @property
    def registry(self) -> CollectorRegistry:
        """This app's registry, made on first use (module docstring)."""
        with self._lock:
            if self._registry is None:
                from prometheus_client import CollectorRegistry

                registry = CollectorRegistry()
                for collector in self._collectors:
                    registry.register(collector)
                self._registry = registry
            return self._registry

    @classmethod
    def for_control(cls, control: object) -> HostMetrics:
        """Metrics over ``control``'s ``chat_stats`` and ``metrics_reading`` (each when it has one)."""
        chat = getattr(control, "chat_stats", None)
        reading = getattr(control, "metrics_reading", None)
        return cls(chat if isinstance(chat, ChatStats) else None, reading if callable(reading) else None)


__all__ = [
    "INSTANCE_STATES",
    "METRICS_PATH",
    "NO_INSTANCE",
    "UNMATCHED",
    "HostCollector",
    "HostMetrics",
    "MetricsMiddleware",
    "MetricsResource",
    "MetricsReading",
    "RequestTally",
]
