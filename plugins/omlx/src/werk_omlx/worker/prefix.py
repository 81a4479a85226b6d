"""The worker-local exact-prefix cache (``werk serve --persistence`` with mode auto/disk).

After each generation the worker keeps the KV state of the tokens it processed: the most recent
one live in memory, and every one as a file in ``directory`` (the worker's private
``cache/prefix-cache/``), least recently used files dropped beyond ``max_bytes``. A new prompt
reuses the longest stored state whose tokens are an exact prefix of it (compared token by
token, never by hash alone), trimmed to at most ``len(prompt) - 1`` tokens so that at least one
token is evaluated; only the rest of the prompt is prefilled. Reuse needs at least
``min_tokens`` matching tokens and a trimmable cache (plain KV caches; models with recurrent
state never reuse). A miss is an ordinary prefill. Nothing here survives the worker: the
directory is the worker's own and new workers start empty (docs/omlx.md, "Prefix cache").
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlx_lm.models.cache import can_trim_prompt_cache, load_prompt_cache, save_prompt_cache, trim_prompt_cache

DEFAULT_MAX_BYTES = 4 * 1024**3
MIN_TOKENS = 4

PromptCache = list[Any]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def cache_length(cache: PromptCache) -> int:
    return int(cache[0].offset) if cache else 0


@dataclass
class Entry:
    tokens: tuple[int, ...]
    file: Path
    bytes: int


@dataclass
class PrefixStats:
    lookups: int = 0
    hits: int = 0
    reused_tokens: int = 0
    stored: int = 0
    dropped: int = 0


class PrefixCache:
    """See the module docstring."""

    def __init__(self, directory: Path, max_bytes: int = DEFAULT_MAX_BYTES, min_tokens: int = MIN_TOKENS) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.min_tokens = min_tokens
        self.stats = PrefixStats()
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        self._hot: tuple[tuple[int, ...], PromptCache] | None = None
        self._lock = threading.Lock()
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        for stale in directory.glob("*.safetensors"):
            stale.unlink()

    @property
    def bytes(self) -> int:
        return sum(e.bytes for e in self._entries.values())

    def lookup(self, prompt: Sequence[int], fresh: Callable[[], PromptCache]) -> tuple[PromptCache, int]:
        """A cache holding the longest reusable prefix of ``prompt`` and that prefix's length
        (``fresh()`` and 0 on a miss). The returned cache belongs to the caller."""
        with self._lock:
            self.stats.lookups += 1
            limit = len(prompt) - 1
            best_len, best_key = 0, None
            if self._hot is not None:
                best_len = min(common_prefix(self._hot[0], prompt), limit)
            for key, entry in self._entries.items():
                n = min(common_prefix(entry.tokens, prompt), limit)
                if n > best_len:
                    best_len, best_key = n, key
            if best_len < self.min_tokens:
                return fresh(), 0
            if best_key is None and self._hot is not None:
                cache = self._hot[1]
                self._hot = None  # the caller extends it in place
            else:
                assert best_key is not None
                self._entries.move_to_end(best_key)
                cache = load_prompt_cache(str(self._entries[best_key].file))  # type: ignore[no-untyped-call]
            excess = cache_length(cache) - best_len
            if excess > 0:
                trim_prompt_cache(cache, excess)
            self.stats.hits += 1
            self.stats.reused_tokens += best_len
            return cache, best_len

    def store(self, tokens: Sequence[int], cache: PromptCache) -> None:
        """Keep ``cache`` (the state of ``tokens`` processed, possibly one more) for reuse."""
        if not cache or not can_trim_prompt_cache(cache):
            return
        length = cache_length(cache)
        if length > len(tokens):
            trim_prompt_cache(cache, length - len(tokens))
        kept = tuple(int(t) for t in tokens[: cache_length(cache)])
        if len(kept) < self.min_tokens:
            return
        key = hashlib.sha256(json.dumps(kept).encode()).hexdigest()[:32]
        path = self.directory / f"{key}.safetensors"
        with self._lock:
            save_prompt_cache(str(path), cache)
            self._entries.pop(key, None)
            self._entries[key] = Entry(kept, path, path.stat().st_size)
            self.stats.stored += 1
            while self._entries and self.bytes > self.max_bytes:
                _, old = self._entries.popitem(last=False)
                old.file.unlink(missing_ok=True)
                self.stats.dropped += 1
            self._hot = (kept, cache)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            s = self.stats
            return {
                "entries": len(self._entries),
                "bytes": self.bytes,
                "max_bytes": self.max_bytes,
                "lookups": s.lookups,
                "hits": s.hits,
                "reused_tokens": s.reused_tokens,
                "stored": s.stored,
                "dropped": s.dropped,
            }
