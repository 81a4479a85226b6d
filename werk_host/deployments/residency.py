"""Residency: which instances may be loaded together, and making room for a start.

Contract (docs/deployments.md, "Residency limits", "Eviction order", "Memory estimate"):

* Every start is admitted here first (:meth:`Residency.admit`, called by
  :meth:`~werk_host.deployments.instances.Instance.use`). Admission decides, under one lock, which
  loaded instances must be unloaded: the other loaded members of a ``swap`` group; for an
  ``exclusive`` group, every loaded instance outside it that is neither pinned nor in a
  ``persistent`` group; then, least recently used first, enough instances to stay within the
  group's ``max_loaded``, the host-wide ``max_loaded`` and the memory the instance needs.
  "Loaded" is ready, stopping, or admitted and still starting.
* Never unloaded to make room: a pinned instance, a member of a ``persistent`` group (for an
  instance outside that group), an instance with requests in flight (it is waited for), an
  instance still starting (waited for). An instance kept only by live, unredeemed handoffs is
  waited for at most ``handoff_wait``; then it is unloaded all the same and those handoffs
  expire (a decode answers 410, as after any restart), so no key holds an instance resident
  with a handoff it never redeems. The plan runs only when every instance
  it unloads is idle; until then the request waits, at most ``load_timeout``, then gets a
  retryable 503 with ``Retry-After``. When no wait can help (every candidate pinned or
  protected, or the memory is not there even with them all unloaded) the start is refused at
  once with ``resource_exhausted`` and the reason.
* Unloads go through :meth:`~werk_host.deployments.instances.Instance.stop`, the one stop path
  (it closes the adapter, so a backend can save what it keeps across restarts), asked under the
  instance's own lock whether a request or a handoff arrived meanwhile.
* At most ``load_queue`` requests wait for room or for a start at once; more are refused at
  once with a retryable 503.
* Memory (werk_host/deployments/footprint.py): an instance needs its ``memory`` when the profile
  declares it; else its model files, the KV cache its backend expects for the configured context
  and an overhead, in host memory and, for the share of its layers its launch configuration puts
  on an accelerator, accelerator memory; once it has run, the most resident memory its processes
  were seen to hold replaces the host part. A start is admitted when that fits in what the host's
  memory telemetry (``werk_host/memory``) sees available now, pool by pool, less what admitted
  starts will still take; a pool that is not observable is not checked.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import psutil  # type: ignore[import-untyped]

from werk_host.deployments import footprint
from werk_host.deployments.footprint import NONE, Available, Footprint, mib
from werk_host.deployments.instances import Instance, InstanceView
from werk_host.deployments.rules import GroupSpec, ResidencyRules
from werk_host.errors import RETRY_AFTER, ErrorCode, WerkError
from werk_host.memory import HostMemorySource, MemoryManager, NvmlAcceleratorSource
from werk_host.protocol.deployments import InstanceStateName

log = logging.getLogger(__name__)

#: How often a waiting admission looks again without being woken (memory and handoffs change
#: without an instance event).
RECHECK_S = 0.25
#: ``Retry-After`` when no load time is known yet.
DEFAULT_RETRY_AFTER_S = 5


@dataclass
class _Plan:
    #: instances to unload, in order
    unload: list[Instance] = field(default_factory=list)
    #: why they go (for their log and the server log)
    why: str = ""
    #: the refusal when no wait can help
    refusal: WerkError | None = None


class Residency:
    """Admission of starts for one deployment set (see the module docstring). Thread-safe."""

    def __init__(
        self,
        rules: ResidencyRules,
        *,
        live_handoffs: Callable[[Instance], bool] = lambda _instance: False,
        expire_handoffs: Callable[[str], int] = lambda _identity: 0,
        memory: MemoryManager | None = None,
    ) -> None:
        self.rules = rules
        self.load_timeout_s = rules.load_timeout_s
        self.instances: Mapping[str, Instance] = {}
        self._live_handoffs = live_handoffs
        #: drops the live handoffs of one adapter identity (an unloaded process), returns how many
        self._expire_handoffs = expire_handoffs
        #: the host's memory telemetry (the one ``/werk/v1/memory`` reports)
        self.memory = memory or MemoryManager(HostMemorySource(), NvmlAcceleratorSource())
        self._cond = threading.Condition()
        self._admitted: set[str] = set()
        self._waiting = 0
        self._measured: dict[str, int] = {}
        self._estimates: dict[str, Footprint] = {}

    def bind(self, instances: Mapping[str, Instance]) -> None:
        """The instances this residency governs (the deployment set's, once built)."""
        self.instances = instances

    # -- the Room protocol of instances ---------------------------------------------------
    def changed(self) -> None:
        """Wake the admissions waiting for room (:meth:`admit`); with none waiting, nothing to do.
        ``_waiting`` is read without the lock: an admission counted after this read plans after
        the change it was told of (the caller made it before calling), so it cannot miss it."""
        if self._waiting:
            with self._cond:
                self._cond.notify_all()

    def settled(self, instance: Instance) -> None:
        with self._cond:
            self._admitted.discard(instance.id)
            self._cond.notify_all()

    def enqueue(self, instance: Instance) -> None:
        """Count a request waiting for ``instance`` (room or a start); refuse beyond ``load_queue``."""
        with self._cond:
            if self._waiting >= self.rules.load_queue:
                raise WerkError(
                    ErrorCode.UNAVAILABLE,
                    f"{self._waiting} requests already wait for instances to load (load_queue "
                    f"{self.rules.load_queue}); instance {instance.id} was not loaded, retry later",
                    retryable=True,
                    details={RETRY_AFTER: self._retry_after(instance)},
                )
            self._waiting += 1

    def dequeue(self) -> None:
        with self._cond:
            self._waiting = max(self._waiting - 1, 0)

    def timed_out(self, instance: Instance, waited_s: float, reason: str = "") -> WerkError:
        because = f": {reason}" if reason else ""
        return WerkError(
            ErrorCode.UNAVAILABLE,
            f"instance {instance.id} was not loaded within load_timeout {self.load_timeout_s:g} s "
            f"(waited {waited_s:.0f} s){because}; retry later",
            retryable=True,
            details={RETRY_AFTER: self._retry_after(instance)},
        )

    def _retry_after(self, instance: Instance) -> int:
        load_s = instance.view().load_s
        return max(1, round(load_s)) if load_s is not None else DEFAULT_RETRY_AFTER_S

    def admit(self, instance: Instance, deadline: float) -> None:
        began = time.monotonic()
        self.enqueue(instance)
        try:
            while True:
                with self._cond:
                    plan = self._plan(instance)
                    if plan.refusal is not None:
                        raise plan.refusal
                    if not plan.unload:
                        self._admitted.add(instance.id)
                        return
                    # past handoff_wait, live handoffs no longer keep an instance loaded
                    overrule = time.monotonic() - began >= self.rules.handoff_wait_s
                    waiting_for = [v.id for v in plan.unload if not self._idle(v, overrule)]
                    if waiting_for:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            reason = f"waiting for {', '.join(waiting_for)} to go idle ({plan.why})"
                            raise self.timed_out(instance, time.monotonic() - began, reason)
                        self._cond.wait(min(remaining, RECHECK_S))
                        continue
                for victim in plan.unload:  # outside the lock: a stop takes as long as the backend's close
                    self._unload(victim, f"unloaded to load {instance.id} ({plan.why})", overrule)
        finally:
            self.dequeue()

    def _unload(self, victim: Instance, why: str, overrule: bool) -> None:
        """Stop ``victim`` unless a request (or, before ``handoff_wait`` passed, a handoff)
        arrived since the plan was made (asked under the victim's lock by :meth:`Instance.stop`);
        with ``overrule``, the handoffs of the process it stopped expire."""
        adapter = victim.peek()
        identity = adapter.identity() if adapter is not None else None
        held = self._live_handoffs(victim)
        if not victim.stop(why, keep=lambda: victim.in_flight > 0 or (not overrule and self._live_handoffs(victim))):
            return
        if overrule and held and identity is not None:
            expired = self._expire_handoffs(identity)
            log.info(
                "instance %s: %d live handoffs expired after handoff_wait %g s",
                victim.id,
                expired,
                self.rules.handoff_wait_s,
            )

    # -- planning -------------------------------------------------------------------------
    def _idle(self, instance: Instance, overrule: bool = False) -> bool:
        """Ready with nothing in flight and (unless ``overrule``: handoff_wait passed) no live handoff."""
        view = instance.view()
        if view.state is not InstanceStateName.READY or view.in_flight != 0:
            return False
        return overrule or not self._live_handoffs(instance)

    def _plan(self, instance: Instance) -> _Plan:
        views = {i.id: i.view() for i in self.instances.values()}
        resident = [
            i
            for i in self.instances.values()
            if i is not instance
            and (i.id in self._admitted or views[i.id].state in (InstanceStateName.READY, InstanceStateName.STOPPING))
        ]
        group = self.rules.group_of(instance.id)
        plan = _Plan()
        reasons: list[str] = []
        if group is not None and group.swap:
            plan.unload += [i for i in resident if i.id in group.members]
            reasons.append(f"group {group.name} loads one member at a time")
            pinned = [i.id for i in plan.unload if views[i.id].pinned]
            if pinned:
                return self._refuse(instance, f"{', '.join(pinned)} of swap group {group.name} is pinned")
        if group is not None and group.exclusive:
            outside = [i for i in resident if i.id not in group.members and not self._shielded(i, group, views)]
            plan.unload += [i for i in outside if i not in plan.unload]
            reasons.append(f"group {group.name} is exclusive")
        rest = _lru([i for i in resident if i not in plan.unload], views)
        if group is not None and group.limit is not None and not group.swap:
            members = [i for i in rest if i.id in group.members]
            over = len(members) + 1 - group.limit
            if over > 0:
                candidates = [i for i in members if not views[i.id].pinned]
                if len(candidates) < over:
                    return self._refuse(instance, f"group {group.name} has max_loaded {group.limit} pinned members")
                plan.unload += _prefer_idle(candidates, over, self._idle)
                reasons.append(f"group {group.name} max_loaded {group.limit}")
        rest = [i for i in rest if i not in plan.unload]
        if self.rules.max_loaded is not None:
            over = len(rest) + 1 - self.rules.max_loaded
            if over > 0:
                candidates = [i for i in rest if not self._shielded(i, group, views)]
                if len(candidates) < over:
                    held = ", ".join(i.id for i in rest if i not in candidates)
                    return self._refuse(
                        instance, f"max_loaded {self.rules.max_loaded} is reached by pinned or persistent {held}"
                    )
                plan.unload += _prefer_idle(candidates, over, self._idle)
                reasons.append(f"max_loaded {self.rules.max_loaded}")
        memory = self._memory(instance, [i for i in rest if i not in plan.unload], plan.unload, group, views)
        if isinstance(memory, WerkError):
            plan.refusal = memory
            return plan
        if memory:
            plan.unload += memory
            reasons.append("memory")
        plan.why = "; ".join(reasons)
        return plan

    def _shielded(self, other: Instance, group: GroupSpec | None, views: Mapping[str, InstanceView]) -> bool:
        """Whether ``other`` stays loaded whatever a start of a member of ``group`` needs."""
        if views[other.id].pinned:
            return True
        other_group = self.rules.group_of(other.id)
        return other_group is not None and other_group.persistent and other_group is not group

    def _memory(
        self,
        instance: Instance,
        rest: list[Instance],
        unloading: list[Instance],
        group: GroupSpec | None,
        views: Mapping[str, InstanceView],
    ) -> list[Instance] | WerkError:
        """More instances to unload (least recently used first) so the start fits in host and
        accelerator memory; the refusal, with the figures, when it cannot fit even with every
        candidate unloaded."""
        wanted = self.footprint(instance)
        if wanted.total == 0:
            return []
        now = footprint.available(self.memory)
        need = now.fold(wanted)
        pending = sum((now.fold(self.footprint(self.instances[i])) for i in self._admitted if i != instance.id), NONE)
        freed = sum((now.fold(self.footprint(i)) for i in unloading), NONE)
        have = Footprint((now.host or 0) - pending.host, (now.accelerator or 0) - pending.accelerator) + freed
        extra: list[Instance] = []
        candidates = [i for i in rest if not self._shielded(i, group, views)]
        for idle_first in (True, False):
            for candidate in candidates:
                short = _short(need, have, now)
                if not short:
                    break
                gain = now.fold(self.footprint(candidate))
                helps = any(getattr(gain, pool) > 0 for pool in short)
                if candidate not in extra and self._idle(candidate) == idle_first and helps:
                    extra.append(candidate)
                    have, freed = have + gain, freed + gain
        short = _short(need, have, now)
        if short:
            pool = short[0]
            sources = [f"{mib(getattr(now, pool) or 0)} available now"]
            if getattr(pending, pool):
                sources.append(f"less {mib(getattr(pending, pool))} held for starts still loading")
            gone = [i.id for i in (*unloading, *extra)]
            if gone:
                sources.append(f"plus {mib(getattr(freed, pool))} from unloading {', '.join(gone)}")
            return WerkError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"instance {instance.id} needs about {mib(getattr(need, pool))} of {pool} memory "
                f"({wanted.detail}) but only {mib(getattr(have, pool))} can be made available "
                f"({', '.join(sources)}; pinned and persistent instances stay loaded); it was not started",
                retryable=True,
            )
        return extra

    def _refuse(self, instance: Instance, reason: str) -> _Plan:
        return _Plan(
            refusal=WerkError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"instance {instance.id} cannot be loaded: {reason} (an operator may unpin or unload it)",
                retryable=True,
            )
        )

    # -- the memory estimate --------------------------------------------------------------
    def footprint(self, instance: Instance) -> Footprint:
        """What ``instance`` needs loaded (werk_host/deployments/footprint.py): the estimate
        before it has run, the resident memory its processes were seen to hold after."""
        before = self._estimates.get(instance.id)
        if before is None:
            before = self._estimates[instance.id] = footprint.estimate(instance)
        resident = self._measured.get(instance.id, 0)
        return footprint.measured(instance, before, resident) if resident else before

    def estimate(self, instance: Instance) -> int:
        """Bytes ``instance`` needs loaded, host and accelerator together; 0 for a remote one."""
        return self.footprint(instance).total

    def measure(self, instance: Instance, pids: Iterable[int]) -> None:
        """Remember the resident memory of ``instance``'s processes (and their children) now, when
        it is more than seen before."""
        total = 0
        for pid in pids:
            try:
                process = psutil.Process(pid)
                total += process.memory_info().rss
                total += sum(child.memory_info().rss for child in process.children(recursive=True))
            except psutil.Error:
                continue
        with self._cond:
            if total > self._measured.get(instance.id, 0):
                self._measured[instance.id] = total


def _short(need: Footprint, have: Footprint, now: Available) -> list[str]:
    """The observable pools (``host``, ``accelerator``) in which ``need`` exceeds ``have``."""
    pools = [("host", now.host), ("accelerator", now.accelerator)]
    return [pool for pool, seen in pools if seen is not None and getattr(need, pool) > getattr(have, pool)]


def _lru(instances: list[Instance], views: Mapping[str, InstanceView]) -> list[Instance]:
    """Least recently used first (never used: first of all), by the monotonic clock."""
    return sorted(instances, key=lambda i: (views[i.id].last_used_unix_ms is not None, i.last_used))


def _prefer_idle(candidates: list[Instance], count: int, idle: Callable[[Instance], bool]) -> list[Instance]:
    """``count`` of ``candidates`` (in LRU order): idle ones first, then busy ones (waited for)."""
    ordered = [i for i in candidates if idle(i)] + [i for i in candidates if not idle(i)]
    return ordered[:count]
