"""Residency rules of a deployment profile: how many instances may be loaded at once, and groups.

The profile's ``[residency]`` table and ``[group.NAME]`` tables (docs/deployments.md,
"Residency limits") are parsed here into :class:`ResidencyRules`; ``werk serve --max-loaded N``
replaces the host-wide limit (:meth:`ResidencyRules.with_max_loaded`). Checking follows the
profile's contract (werk_host/deployments/profile.py): every fault is reported through the
profile checker's ``fail(path, detail)`` with the file, line and field, never ignored.

* ``[residency]``: ``max_loaded`` (instances loaded at once, host-wide; default unlimited),
  ``load_timeout`` (how long a request waits for room or a start before a retryable 503 with
  ``Retry-After``; default 2m), ``load_queue`` (how many requests may wait for room at once;
  default 32, more are refused at once), ``loading_notice`` (``true``: a streamed chat request
  that starts a load gets a loading notice in its stream while the instance starts, the way
  llama-swap's ``sendLoadingState`` does; default ``false``; an instance's own
  ``loading_notice`` overrides it; docs/deployments.md, "Loading notice"), ``handoff_wait``
  (how long a start waits for an instance that only live, unredeemed handoffs keep loaded
  before it unloads it anyway and those handoffs expire, answering 410; default 10s;
  docs/deployments.md, "Eviction order").
* ``[group.NAME]``: ``members`` (instance ids, each in at most one group), ``swap`` (at most one
  member loaded: loading one unloads the others), ``exclusive`` (loading a member unloads every
  loaded instance outside the group that is not pinned or persistent), ``persistent`` (members
  are never unloaded to make room for instances outside the group), ``max_loaded`` (members
  loaded at once).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import NoReturn

from werk_host.deployments.durations import DURATION_HINT, MAX_DURATION_S, parse_duration

#: ``[residency]`` keys.
RESIDENCY_KEYS = ("max_loaded", "load_timeout", "load_queue", "loading_notice", "handoff_wait")
#: ``[group.NAME]`` keys.
GROUP_KEYS = ("members", "swap", "exclusive", "persistent", "max_loaded")
#: Defaults of ``[residency]``.
DEFAULT_LOAD_TIMEOUT_S = 120.0
DEFAULT_LOAD_QUEUE = 32
#: How long a start waits for idle handoffs before it unloads their instance anyway.
DEFAULT_HANDOFF_WAIT_S = 10.0
#: The largest ``max_loaded`` / ``load_queue`` a profile may give.
MAX_COUNT = 4096

DocPath = tuple[str | int, ...]
Fail = Callable[[DocPath, str], NoReturn]


@dataclass(frozen=True)
class GroupSpec:
    """One ``[group.NAME]``."""

    name: str
    members: tuple[str, ...]
    swap: bool = False
    exclusive: bool = False
    persistent: bool = False
    #: members loaded at once (``None``: no group limit; ``swap`` means 1)
    max_loaded: int | None = None

    @property
    def limit(self) -> int | None:
        """The most members loaded at once: 1 for a swap group, else ``max_loaded``."""
        return 1 if self.swap else self.max_loaded


@dataclass(frozen=True)
class ResidencyRules:
    """The host-wide limits and the groups (by name, in profile order)."""

    max_loaded: int | None = None
    load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S
    load_queue: int = DEFAULT_LOAD_QUEUE
    groups: Mapping[str, GroupSpec] = field(default_factory=lambda: MappingProxyType({}))
    #: streamed chat requests that start a load get a loading notice (an instance may override)
    loading_notice: bool = False
    #: how long a start waits for an instance kept only by live handoffs (then they expire)
    handoff_wait_s: float = DEFAULT_HANDOFF_WAIT_S

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", MappingProxyType(dict(self.groups)))

    def group_of(self, instance_id: str) -> GroupSpec | None:
        """The group ``instance_id`` belongs to, or ``None``."""
        return next((g for g in self.groups.values() if instance_id in g.members), None)

    def with_max_loaded(self, max_loaded: int | None) -> ResidencyRules:
        """These rules with the host-wide limit replaced (``werk serve --max-loaded``); ``None``
        keeps the profile's."""
        return self if max_loaded is None else replace(self, max_loaded=max_loaded)


def _count(fail: Fail, at: DocPath, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        fail(at, f"must be a whole number from 1 to {MAX_COUNT}")
    if not 1 <= value <= MAX_COUNT:
        fail(at, f"{value} is out of range: a whole number from 1 to {MAX_COUNT}")
    return value


def _flag(fail: Fail, at: DocPath, value: object) -> bool:
    if not isinstance(value, bool):
        fail(at, "must be true or false")
    return value


def parse_residency(fail: Fail, value: object) -> tuple[int | None, float, int, bool, float]:
    """``[residency]``: ``(max_loaded, load_timeout_s, load_queue, loading_notice, handoff_wait_s)``."""
    if not isinstance(value, dict):
        fail(("residency",), "must be a table ([residency])")
    for key in value:
        if key not in RESIDENCY_KEYS:
            fail(("residency", key), f"unknown key ([residency] takes {', '.join(RESIDENCY_KEYS)})")
    max_loaded = _count(fail, ("residency", "max_loaded"), value["max_loaded"]) if "max_loaded" in value else None
    queue = _count(fail, ("residency", "load_queue"), value.get("load_queue", DEFAULT_LOAD_QUEUE))
    notice = _flag(fail, ("residency", "loading_notice"), value.get("loading_notice", False))
    timeout = _timeout(fail, "load_timeout", value.get("load_timeout", DEFAULT_LOAD_TIMEOUT_S))
    handoff_wait = _timeout(fail, "handoff_wait", value.get("handoff_wait", DEFAULT_HANDOFF_WAIT_S))
    return max_loaded, timeout, queue, notice, handoff_wait


def _timeout(fail: Fail, key: str, raw: object) -> float:
    at: DocPath = ("residency", key)
    if isinstance(raw, str):
        try:
            seconds = parse_duration(raw)
        except ValueError as err:
            fail(at, str(err))
    elif isinstance(raw, int | float) and not isinstance(raw, bool) and math.isfinite(raw):
        seconds = float(raw)
    else:
        fail(at, f"must be a duration {DURATION_HINT} or seconds")
    if seconds is None or not 0 < seconds <= MAX_DURATION_S:
        fail(at, "must be more than 0 and at most a year (a request cannot wait forever)")
    return seconds


def parse_groups(fail: Fail, value: object, ids: Mapping[str, int]) -> dict[str, GroupSpec]:
    """``[group.NAME]`` tables; every member an instance id, each in one group at most."""
    if not isinstance(value, dict):
        fail(("group",), "must be a table of groups ([group.NAME] tables)")
    groups: dict[str, GroupSpec] = {}
    member_of: dict[str, str] = {}
    for name, body in value.items():
        at: DocPath = ("group", name)
        if not isinstance(body, dict):
            fail(at, "must be a table with members = [...]")
        for key in body:
            if key not in GROUP_KEYS:
                fail((*at, key), f"unknown key (a group takes {', '.join(GROUP_KEYS)})")
        members = body.get("members")
        if not isinstance(members, list) or not members:
            fail((*at, "members"), "must be a non-empty array of instance ids")
        for index, member in enumerate(members):
            where: DocPath = (*at, "members", index)
            if not isinstance(member, str) or member not in ids:
                fail(where, f"must be an instance id (instances: {', '.join(ids)})")
            if member in member_of:
                fail(where, f"instance {member} is already a member of group {member_of[member]}")
            member_of[member] = name
        swap = _flag(fail, (*at, "swap"), body.get("swap", False))
        persistent = _flag(fail, (*at, "persistent"), body.get("persistent", False))
        max_loaded = _count(fail, (*at, "max_loaded"), body["max_loaded"]) if "max_loaded" in body else None
        if swap and max_loaded is not None and max_loaded != 1:
            fail((*at, "max_loaded"), "a swap group loads one member at a time; drop max_loaded or swap")
        groups[name] = GroupSpec(
            name,
            tuple(members),
            swap=swap,
            exclusive=_flag(fail, (*at, "exclusive"), body.get("exclusive", False)),
            persistent=persistent,
            max_loaded=max_loaded,
        )
    return groups


#: Units of an instance's ``memory``: binary multiples only, so a size means one thing.
_UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_SIZE_HINT = 'a size such as "512MiB", "7.5GiB" or a whole number of bytes'


def parse_memory(fail: Fail, at: DocPath, value: object, *, allow_zero: bool = False) -> int:
    """An instance's ``memory``: what it needs loaded, declared by the operator instead of
    estimated (docs/deployments.md, "Memory estimate"); with ``allow_zero`` any size from 0 (an
    instance's ``prompt_cache`` budget, docs/prompt-cache.md)."""
    if isinstance(value, int) and not isinstance(value, bool):
        nbytes = value
    elif isinstance(value, str):
        unit = next((u for u in _UNITS if value.endswith(u)), None)
        number = value[: -len(unit)] if unit is not None else ""
        try:
            amount = float(number) if number and number.replace(".", "", 1).isdigit() else -1.0
        except ValueError:
            amount = -1.0
        if unit is None or amount < 0:
            fail(at, f"{json.dumps(value)} is not {_SIZE_HINT}")
        nbytes = int(amount * _UNITS[unit])
    else:
        fail(at, f"must be {_SIZE_HINT}")
    if not (nbytes >= 0 if allow_zero else nbytes > 0) or nbytes > 1 << 50:
        fail(at, f"must be {'0' if allow_zero else 'more than 0'} bytes to 1024TiB")
    return nbytes
