"""The service's one cache layer for listings: values kept under an explicit stamp.

A listing the service hands out again (the capability listing, a page of states) is kept in a
:class:`StampedCache` under its key together with the *stamp* of everything it was built from:
the store page's read stamp (:class:`werk_host.store.store.ListedPage`), the capability
evidence key (:meth:`werk_host.service.capabilities.CapabilityResolver.evidence_key`: the
adapter's process identity, the operation count of
:meth:`werk_host.pluginhost.PluginHost.operations`, the evidence TTL window), the
compatibility keys it used. An entry is reused only while the caller's current stamp
equals the kept one; nothing is keyed by object identity, so a defensive copy anywhere cannot
defeat (or fool) it. Each entry is bounded (the map is cleared wholesale when full).

The kept value is a :class:`Shared`: the immutable protocol result and its JSON text, made at
most once per entry, which the HTTP layer writes as is (:func:`werk_host.http.io.render_shared`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from werk_host.protocol.envelope import data_json

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


class Shared(Generic[T]):
    """An immutable result (never mutate ``value``) and its JSON text, serialized once."""

    __slots__ = ("value", "_text")

    def __init__(self, value: T) -> None:
        self.value = value
        self._text: str | None = None

    @property
    def text(self) -> str:
        """``data_json(value)``, computed on first use (two racing threads compute equal text)."""
        text = self._text
        if text is None:
            text = self._text = data_json(self.value)
        return text


class StampedCache(Generic[K, T]):
    """Values per key, each valid only under the stamp it was stored with (thread-safe)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: dict[K, tuple[Hashable, T]] = {}
        self._lock = threading.Lock()

    def get(self, key: K, stamp: Hashable) -> T | None:
        """The value kept under ``key`` when it was stored with a stamp equal to ``stamp``."""
        hit = self._entries.get(key)  # a dict read is atomic; writers hold the lock
        return hit[1] if hit is not None and hit[0] == stamp else None

    def put(self, key: K, stamp: Hashable, value: T) -> T:
        with self._lock:
            if len(self._entries) >= self._size and key not in self._entries:
                self._entries.clear()
            self._entries[key] = (stamp, value)
        return value

    def get_or_make(self, key: K, stamp: Hashable, make: Callable[[], T]) -> T:
        found = self.get(key, stamp)
        return found if found is not None else self.put(key, stamp, make())
