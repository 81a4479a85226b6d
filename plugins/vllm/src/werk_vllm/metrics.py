"""Reading vLLM's Prometheus ``/metrics`` into worker observations.

Parsed with :mod:`prometheus_client.parser`. Every value is summed over vLLM's engines
(``engine`` label), except KV-cache usage, which is their mean:

* ``requests_running`` / ``requests_waiting``: ``vllm:num_requests_running`` / ``..._waiting``;
* ``kv_cache_usage``: ``vllm:kv_cache_usage_perc`` (a fraction, 1 = full; older servers:
  ``vllm:gpu_cache_usage_perc``);
* ``prefix_cache_hit_rate``: ``vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total``
  (tokens), ``None`` before any query;
* ``kv_capacity_tokens``: the ``kv_cache_size_tokens`` label of ``vllm:cache_config_info``
  (else ``num_gpu_blocks * block_size`` from its labels).

A metric the server does not export stays ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["VllmMetrics", "parse_metrics"]


@dataclass(frozen=True)
class VllmMetrics:
    requests_running: int | None = None
    requests_waiting: int | None = None
    kv_cache_usage: float | None = None
    prefix_cache_hit_rate: float | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    kv_capacity_tokens: int | None = None


def _label_int(labels: dict[str, str], name: str) -> int | None:
    value = labels.get(name, "")
    return int(value) if value.isdigit() else None


def parse_metrics(text: str) -> VllmMetrics:
    """The values of the module docstring from a ``/metrics`` text; ``ValueError`` when it is not
    Prometheus text."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    capacity: int | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name == "vllm:cache_config_info":
                tokens = _label_int(sample.labels, "kv_cache_size_tokens")
                blocks = _label_int(sample.labels, "num_gpu_blocks")
                size = _label_int(sample.labels, "block_size")
                if tokens is None and blocks is not None and size is not None:
                    tokens = blocks * size
                if tokens is not None:
                    capacity = (capacity or 0) + tokens
                continue
            if not name.startswith("vllm:"):
                continue
            sums[name] = sums.get(name, 0.0) + float(sample.value)
            counts[name] = counts.get(name, 0) + 1

    def total(name: str) -> float | None:
        return sums.get(name)

    def whole(name: str) -> int | None:
        value = total(name)
        return int(value) if value is not None else None

    usage_name = "vllm:kv_cache_usage_perc" if "vllm:kv_cache_usage_perc" in sums else "vllm:gpu_cache_usage_perc"
    usage = sums[usage_name] / counts[usage_name] if usage_name in sums else None
    queries = total("vllm:prefix_cache_queries_total")
    hits = total("vllm:prefix_cache_hits_total")
    rate = hits / queries if queries and hits is not None else None
    return VllmMetrics(
        requests_running=whole("vllm:num_requests_running"),
        requests_waiting=whole("vllm:num_requests_waiting"),
        kv_cache_usage=usage,
        prefix_cache_hit_rate=rate,
        prefix_cache_queries=queries,
        prefix_cache_hits=hits,
        kv_capacity_tokens=capacity,
    )
