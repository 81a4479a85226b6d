"""Storage bounds: how many states, and how many bytes, the catalog and each principal may hold.

Contract (docs/states.md, "Quotas"):

* A state's **footprint** is its payload plus its metadata files (``metadata.json`` and
  ``metadata.sha256``), computed from the metadata alone (:func:`footprint`); access-time and
  pin markers, staging entries and quarantined states are not counted.
* The store holds at most ``max_states`` states and ``max_bytes`` bytes of footprint, and each
  principal at most ``max_states_per_key`` and ``max_bytes_per_key`` of them (by default a
  :data:`.layout.PER_KEY_SHARE` of the store-wide bounds, so one key cannot fill the store).
* :meth:`QuotaStore._admit_locked` runs under the catalog locks, and a commit calls it again
  immediately before the rename that publishes its state: two commits racing, in any thread or
  process, cannot both pass a bound. A refusal is a retryable ``resource_exhausted`` (429),
  like a full filesystem; deleting or pruning states, or their expiry, makes room.
* :meth:`QuotaStore.admit` lets the service refuse a key at a bound before any backend work
  (the commit still checks for itself).
* Usage is kept in ``_usage``, per principal, for the listing version it was computed from
  (:mod:`.index`): an unchanged listing costs nothing, a changed one is brought up to date by
  difference (the footprint of a new id is read from its cached metadata once), and a commit
  adds its own state without any scan. Only this layer reads or writes ``_usage``, under the
  process mutex.
"""

from __future__ import annotations

import os

from werk_host.errors import WerkError, exhausted

from . import _fs
from .layout import CHECKSUM_BYTES, Usage, os_error
from .reconcile import ReconcilingStore
from .records import PRINCIPAL_RE, Metadata, validate_principal


def footprint(meta: Metadata, encoded: bytes | None = None) -> int:
    """Bytes a state counts against its bounds: payload, metadata and its checksum file."""
    return meta.size + len(meta.encode() if encoded is None else encoded) + CHECKSUM_BYTES


class QuotaStore(ReconcilingStore):
    """Maintains ``_usage`` and enforces the storage bounds (module contract)."""

    def _principal_usage(self, principal: str, pfd: int) -> Usage:
        """Under the locks: this principal's usage for its exact current listing."""
        listing = self._listing(principal, pfd, exact=True)
        usage = self._usage.get(principal)
        if usage is not None and usage.version == listing.version:
            return usage
        old = usage.sizes if usage is not None else {}
        fresh = Usage(listing.version)
        for sid in listing.ids:
            n = old.get(sid)
            if n is None:
                n = self._footprint_on_disk(pfd, principal, sid)
            fresh.sizes[sid] = n
            fresh.bytes += n
        self._usage[principal] = fresh
        return fresh

    def _footprint_on_disk(self, pfd: int, principal: str, sid: str) -> int:
        """From the (cached) metadata; a state without valid metadata counts its files' sizes."""
        try:
            sfd = _fs.open_dir(sid, pfd)
        except OSError:
            return 0
        try:
            meta = self._load_meta(sfd, principal, sid)
        finally:
            os.close(sfd)
        if meta is not None:
            return footprint(meta)
        return _fs.tree_size(sid, pfd) or 0

    def _store_usage(self, rootfd: int, principal: str, pfd: int | None) -> tuple[Usage, int, int]:
        """Under the locks: (this principal's usage, states in the store, bytes in the store);
        ``pfd`` ``None``: the principal has no directory yet."""
        mine = Usage(-1) if pfd is None else self._principal_usage(principal, pfd)
        states, used = len(mine.sizes), mine.bytes
        seen = {principal}
        for name in os.listdir(rootfd):
            other = name[2:]
            if other == principal or not name.startswith("p_") or not PRINCIPAL_RE.fullmatch(other):
                continue
            try:
                fd = _fs.open_dir(name, rootfd)
            except OSError:
                continue
            try:
                usage = self._principal_usage(other, fd)
            except OSError:
                continue
            finally:
                os.close(fd)
            seen.add(other)
            states += len(usage.sizes)
            used += usage.bytes
        for gone in [p for p in self._usage if p not in seen]:
            del self._usage[gone]
        return mine, states, used

    def admit(self, principal: str) -> None:
        """Refuse now, before any backend work, a commit that the storage bounds would refuse.

        A key already at a bound is ``resource_exhausted`` (the commit's own message); expired
        states are reconciled away first, exactly as a commit would, before it is refused. A
        ``None`` answer promises nothing: the commit checks again.
        """
        validate_principal(principal)
        try:
            with self._mutating(create=False) as rootfd:
                if rootfd is None:
                    return
                for attempt in range(2):
                    pfd = self._principal_fd(rootfd, principal, create=False)
                    try:
                        self._admit_locked(rootfd, principal, pfd, 0)
                        return
                    except WerkError:
                        if attempt:
                            raise
                    finally:
                        if pfd is not None:
                            os.close(pfd)
                    self._reconcile_locked(rootfd)  # expired states make room
        except OSError as exc:
            raise os_error(exc) from exc

    def _admit_locked(self, rootfd: int, principal: str, pfd: int | None, adding: int) -> int:
        """Under the locks: refuse one more state of ``adding`` bytes over a bound.

        Returns the bytes of footprint still free to this principal once ``adding`` is placed
        (the bound a payload being streamed may not exceed).
        """
        mine, states, used = self._store_usage(rootfd, principal, pfd)
        if len(mine.sizes) + 1 > self._max_states_per_key:
            raise refusal(f"this key already stores {len(mine.sizes)} states, its bound")
        if mine.bytes + adding > self._max_bytes_per_key or (adding == 0 and mine.bytes >= self._max_bytes_per_key):
            raise refusal(f"this key's stored states would exceed its bound of {self._max_bytes_per_key} bytes")
        if states + 1 > self._max_states:
            raise refusal(f"the runtime-state store already holds {states} states, its bound")
        if used + adding > self._max_bytes or (adding == 0 and used >= self._max_bytes):
            raise refusal(f"the runtime-state store would exceed its bound of {self._max_bytes} bytes")
        return min(self._max_bytes_per_key - mine.bytes, self._max_bytes - used) - adding

    def _charge(self, principal: str, sid: str, size: int, before_version: int, after_version: int) -> None:
        """After our own commit under the locks: count ``sid`` without a scan when the usage
        was current for the listing just before it."""
        usage = self._usage.get(principal)
        listing = self._listings.get(principal)
        if (
            usage is None
            or usage.version != before_version
            or listing is None
            or listing.version != after_version
            or sid not in listing.id_set
            or len(listing.ids) != len(usage.sizes) + 1
        ):
            return
        usage.sizes[sid] = size
        usage.bytes += size
        usage.version = after_version


def refusal(message: str) -> WerkError:
    """The retryable ``resource_exhausted`` of a storage bound (module contract)."""
    return exhausted(message + "; delete or prune states, or wait for them to expire", retryable=True)
