"""Server-wide chat counters shared by the inference routes, observability and ``/metrics``.

:class:`ChatStats` is the one source of these counts. It keeps them per instance label (an
adapter instance id, or :data:`DEFAULT_INSTANCE` when a caller names none):
``/werk/v1/observability`` reports the sum over instances, ``GET /metrics`` each instance.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Final

from werk_host.protocol import ChatCounters, MemoryReport

#: The instance label of counts added without one ("no instance selected").
DEFAULT_INSTANCE: Final = "-"


class ChatStats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._per: dict[str, dict[str, int]] = {}

    def add(self, *, instance: str = DEFAULT_INSTANCE, **deltas: int) -> None:
        """Add ``deltas`` (``ChatCounters`` field → change) to ``instance``'s counters."""
        unknown = set(deltas) - set(ChatCounters.model_fields)
        if unknown:
            raise KeyError(", ".join(sorted(unknown)))
        with self._lock:
            counts = self._per.get(instance)
            if counts is None:
                counts = self._per[instance] = dict.fromkeys(ChatCounters.model_fields, 0)
            for key, delta in deltas.items():
                counts[key] += delta

    @contextmanager
    def request(self, *, instance: str = DEFAULT_INSTANCE) -> Iterator[None]:
        """Count one inference request as active for its duration; failures are counted."""
        self.add(instance=instance, requests_total=1, requests_active=1)
        try:
            yield
        except BaseException:
            self.add(instance=instance, requests_failed=1)
            raise
        finally:
            self.add(instance=instance, requests_active=-1)

    def read(self) -> ChatCounters:
        """The counters summed over every instance."""
        with self._lock:
            total = dict.fromkeys(ChatCounters.model_fields, 0)
            for counts in self._per.values():
                for key, value in counts.items():
                    total[key] += value
        return ChatCounters(**total)

    def per_instance(self) -> dict[str, ChatCounters]:
        """The counters of each instance label that has been counted."""
        with self._lock:
            copies = {instance: dict(counts) for instance, counts in self._per.items()}
        return {instance: ChatCounters(**counts) for instance, counts in copies.items()}


@dataclass(frozen=True)
class MetricsReading:
    """What the host reports at scrape time (``LocalControlService.metrics_reading``).

    ``states`` and ``state_bytes`` map a tier to the named (live, committed) states held
    there and their payload bytes; ``instances`` maps an instance id to its state (one of
    :data:`werk_host.http.metrics.INSTANCE_STATES`)."""

    handoffs_live: int
    memory: MemoryReport
    states: Mapping[str, int] = field(default_factory=dict)
    state_bytes: Mapping[str, int] = field(default_factory=dict)
    instances: Mapping[str, str] = field(default_factory=dict)
    #: committed prompt-cache bytes per instance store (docs/prompt-cache.md)
    prompt_cache_bytes: Mapping[str, int] = field(default_factory=dict)
