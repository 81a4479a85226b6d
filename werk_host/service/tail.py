"""The last bytes of a relayed answer, kept as it streams by, for what is read at its end (the
``usage`` object and llama-server's ``timings``; docs/operations.md, "Where relay time goes").

:class:`Tail` holds the most recent chunks by reference and joins them only when they pass twice
its size, so a stream of small events costs no copy per event: at most two tails and one chunk
are held at any time.
"""

from __future__ import annotations


class Tail:
    """The last ``size`` bytes of the chunks :meth:`add` was given."""

    __slots__ = ("size", "_recent", "_held")

    def __init__(self, size: int) -> None:
        self.size = size
        self._recent: list[bytes] = []
        self._held = 0

    def add(self, chunk: bytes) -> None:
        if not chunk:  # a pumped body's "nothing yet" (werk_host/seam.py, Pumpable)
            return
        self._recent.append(chunk)
        self._held += len(chunk)
        if self._held > 2 * self.size:
            kept = b"".join(self._recent)[-self.size :]
            self._recent, self._held = [kept], len(kept)

    def value(self) -> bytes:
        return b"".join(self._recent)[-self.size :]
