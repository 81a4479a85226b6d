"""Evidence for ``runtime.state.prefix_cache``: the engine's own prefix cache, observed hitting.

By default the engine starts with ``prefix_cache_n=0`` (the seed's "no cross-request KV reuse")
and the capability is ``unsupported``. With ``werk serve --persistence`` and reuse not disabled
the engine keeps a prefix cache (docs/candle.md, "Prefix cache"); the capability is reported
``supported`` (operation ``automatic_reuse``) only once a hit was *observed*: the engine's usage
reports ``prompt_tokens_details.cached_tokens`` > 0. Right after a load, a functional check
(:func:`probe_prefix_cache`) runs the pattern the engine reuses — a second chat turn that
extends the first turn's prompt and answer (an identical repeated prompt does not hit) — and
passes when the second turn was served with at least the first prompt's tokens from the cache.
Real responses' usage feeds the hit rate reported with the worker.
"""

from __future__ import annotations

import logging
import threading

from werk_host.plugin import CapabilityReport, CapabilityStatus, WerkError
from werk_host.plugin.openai import Usage

from .engine import Engine, EngineFailure, Sampling
from .template import RAW_ROLE, Message, PromptRenderer

__all__ = ["AUTOMATIC_REUSE", "PrefixEvidence", "probe_prefix_cache"]

log = logging.getLogger(__name__)

AUTOMATIC_REUSE = ("automatic_reuse",)
_FIRST = [Message("user", "Name three colors.")]
_FIRST_TOKENS = 6


class PrefixEvidence:
    """What has been seen of the engine's prefix cache since the model was loaded. Thread-safe."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self._lock = threading.Lock()
        self._probe: bool | None = None
        self._hits = 0
        self._queries = 0

    def reset(self) -> None:
        """Forget everything (the model was unloaded: its cache is gone)."""
        with self._lock:
            self._probe, self._hits, self._queries = None, 0, 0

    def record_probe(self, hit: bool) -> None:
        with self._lock:
            self._probe = hit

    def observe(self, usage: Usage | None) -> None:
        """Count one finished request of real traffic (only while the cache is on)."""
        if not self.enabled or usage is None:
            return
        with self._lock:
            self._queries += 1
            self._hits += 1 if (usage.cached_tokens or 0) > 0 else 0

    def hit_rate(self) -> float | None:
        """Hits over finished requests since the load; ``None`` before any (or when off)."""
        with self._lock:
            return self._hits / self._queries if self.enabled and self._queries else None

    def report(self, loaded: bool) -> CapabilityReport:
        """The ``runtime.state.prefix_cache`` report from this evidence (module docstring)."""
        if not self.enabled:
            return CapabilityReport(
                CapabilityStatus.UNSUPPORTED,
                "the engine runs with prefix_cache_n=0: no cross-request KV reuse "
                "(werk serve --persistence turns the engine's prefix cache on)",
            )
        with self._lock:
            seen = bool(self._probe)
            probed = self._probe is not None
        if not loaded:
            return CapabilityReport(
                CapabilityStatus.UNAVAILABLE, "the model is not loaded; its prefix cache is checked when it loads"
            )
        if seen:
            return CapabilityReport(
                CapabilityStatus.SUPPORTED,
                "the engine's prefix cache is on and a hit was observed: a prompt that extends an earlier "
                "prompt and its answer reuses their KV; Werk cannot name, pin or move cache entries",
                operations=AUTOMATIC_REUSE,
            )
        why = "the functional check saw no hit" if probed else "the functional check did not run"
        return CapabilityReport(
            CapabilityStatus.UNSUPPORTED, f"the engine's prefix cache is on, but {why}; no reuse is claimed"
        )


def _run(engine: Engine, prompt: str, max_tokens: int) -> tuple[str, Usage | None]:
    stream = engine.open(prompt, Sampling(max_tokens=max_tokens, temperature=0.0), RAW_ROLE)
    parts: list[str] = []
    try:
        while (piece := stream.next()) is not None:
            parts.append(piece.text)
    finally:
        stream.close()
    return "".join(parts), stream.usage


def probe_prefix_cache(engine: Engine, renderer: PromptRenderer, evidence: PrefixEvidence) -> None:
    """Run the two-turn functional check on a freshly loaded ``engine`` and record whether the
    second turn reused at least the whole first prompt from the prefix cache. A model without a chat template is checked
    with raw text that the second prompt extends."""
    try:
        if renderer.has_template:
            first = renderer.render(_FIRST)
            answer, _ = _run(engine, first, _FIRST_TOKENS)
            second = renderer.render([*_FIRST, Message("assistant", answer), Message("user", "Two more.")])
        else:
            first = "Werk checks the prefix cache: red, green, blue,"
            answer, _ = _run(engine, first, _FIRST_TOKENS)
            second = f"{first}{answer}\nThe end."
        _, usage = _run(engine, second, 1)
        reused = len(engine.tokenize(first))
    except (EngineFailure, WerkError) as err:
        log.warning("candle: the prefix-cache check failed: %s", getattr(err, "detail", err))
        evidence.record_probe(False)
        return
    hit = usage is not None and (usage.cached_tokens or 0) >= reused
    log.info(
        "candle: prefix-cache check %s (cached tokens: %s)", "hit" if hit else "missed", usage and usage.cached_tokens
    )
    evidence.record_probe(hit)
