"""Lock-free read side: cached directory listings, per-state validation and the fingerprint index.

Contract:

* Nothing here takes the catalog lock or changes a file; everything may run in many
  threads at once (caches are guarded by ``_cache_lock``).
* A cache entry is keyed by the ``stat`` identity of what it was built from and is reused
  only while that identity is unchanged; a read made within :data:`.layout.RACY_MARGIN_NS`
  of the entry's last change is used once but not remembered (the "racy git" rule).
  Under the catalog lock (``exact``) a listing scan is exact and always remembered.
  The one exception to "keyed by what it was built from" is the per-state look cache: it is
  keyed by the state directory's identity alone, which every store writer changes (see
  :meth:`IndexedStore._look`); bytes rewritten in place by anything else are left to payload
  verification and reconciliation.
* :meth:`IndexedStore._look` validates one state cheaply (stats and cached metadata, no
  payload hash). A state found invalid, or marked by :meth:`IndexedStore._mark_suspect`,
  is hidden from reads until a reconciliation settles it.
* The fingerprint index maps prompt fingerprints to ids for one listing version; callers
  re-validate every id it returns.
"""

from __future__ import annotations

import bisect
import os
import stat
from collections.abc import Iterable
from typing import Any

from . import _fs, layout
from .base import StoreBase
from .layout import CHECKSUM, LAST_ACCESSED, META, PAYLOAD, PINNED, STAGING_PREFIX, FpIndex, Kind, Listing, Look
from .records import MAX_METADATA_BYTES, STATE_ID_RE, Metadata, decode_metadata

#: Bound on each of the metadata and access-time caches (cleared wholesale when reached).
_MAX_META_CACHE = 200_000
_INVALID = Kind.INVALID  # read once: enum member access is a descriptor call on the hot path


def _classify(names: Iterable[str]) -> tuple[list[str], list[str], list[str]]:
    """Split a principal directory's names into (sorted state ids, staging entries, others)."""
    ids: list[str] = []
    staging: list[str] = []
    others: list[str] = []
    for name in names:
        if name.startswith("st_") and STATE_ID_RE.fullmatch(name):
            ids.append(name)
        elif name.startswith(STAGING_PREFIX):
            staging.append(name)
        else:
            others.append(name)
    ids.sort()
    return ids, staging, others


class IndexedStore(StoreBase):
    """Maintains ``_listings``, ``_meta_cache``, ``_la_cache``, ``_look_cache``, ``_fp_index`` and ``_suspects``."""

    # ------------------------------------------------------------------ listings

    def _rescan(self, principal: str, pfd: int, *, exact: bool) -> Listing:
        before = os.fstat(pfd)
        t = _fs.now_ns()
        names = os.listdir(pfd)
        after = os.fstat(pfd)
        stable = _fs.ident(before) == _fs.ident(after)
        ids, staging, others = _classify(names)
        listing = Listing(
            ident=_fs.ident(after),
            trusted=stable and (exact or not _fs.racy(after, t, layout.RACY_MARGIN_NS)),
            ids=ids,
            id_set=frozenset(ids),
            staging=staging,
            others=others,
            version=next(self._versions),
        )
        with self._cache_lock:
            self._listings[principal] = listing
        return listing

    def _listing(self, principal: str, pfd: int, *, exact: bool = False) -> Listing:
        """The principal's sorted ids, rescanned only when the directory changed.

        Under the catalog lock (``exact``) a fresh scan is exact; without it a scan of a
        directory changed within the racy margin is not trusted for reuse.
        """
        cur = _fs.ident(os.fstat(pfd))
        with self._cache_lock:
            cached = self._listings.get(principal)
        if cached is not None and cached.ident == cur and cached.trusted:
            return cached
        return self._rescan(principal, pfd, exact=exact)

    def _stamp(
        self,
        principal: str,
        pfd: int,
        before: Listing,
        before_ident: _fs.Ident,
        *,
        add_id: str | None = None,
        add_staging: str | None = None,
        drop_staging: str | None = None,
    ) -> None:
        """After our own change under the lock: update the listing instead of rescanning.

        ``before`` must have been exact for ``before_ident`` (the directory's identity just
        before the change); otherwise the directory is rescanned.
        """
        if before_ident != before.ident:
            self._rescan(principal, pfd, exact=True)
            return
        ids, id_set = before.ids, before.id_set
        if add_id is not None:
            ids = list(ids)
            bisect.insort(ids, add_id)
            id_set = id_set | {add_id}
        staging = [n for n in before.staging if n != drop_staging]
        if add_staging is not None:
            staging.append(add_staging)
        listing = Listing(
            ident=_fs.ident(os.fstat(pfd)),
            trusted=before.trusted,
            ids=ids,
            id_set=id_set,
            staging=staging,
            others=before.others,
            version=next(self._versions) if add_id is not None else before.version,
        )
        with self._cache_lock:
            self._listings[principal] = listing

    # ------------------------------------------------------------------ one state, without the lock

    def _load_meta(self, sfd: int, principal: str, sid: str) -> Metadata | None:
        mst = _fs.lstat_at(META, sfd)
        cst = _fs.lstat_at(CHECKSUM, sfd)
        if mst is None or cst is None or not stat.S_ISREG(mst.st_mode) or not stat.S_ISREG(cst.st_mode):
            return None
        key = (principal, sid)
        cur: tuple[Any, ...] = (_fs.ident(mst), _fs.ident(cst))
        with self._cache_lock:
            cached = self._meta_cache.get(key)
        if cached is not None and cached[0] == cur:
            return cached[1]
        t = _fs.now_ns()
        got_meta = _fs.read_small(META, sfd, MAX_METADATA_BYTES)
        got_sum = _fs.read_small(CHECKSUM, sfd, 65)
        if got_meta is None or got_sum is None:
            return None
        meta = decode_metadata(got_meta[0], got_sum[0], expected_id=sid, expected_principal=principal)
        read_ident = (_fs.ident(got_meta[1]), _fs.ident(got_sum[1]))
        if (
            read_ident == cur
            and not _fs.racy(got_meta[1], t, layout.RACY_MARGIN_NS)
            and not _fs.racy(got_sum[1], t, layout.RACY_MARGIN_NS)
        ):
            with self._cache_lock:
                if len(self._meta_cache) >= _MAX_META_CACHE:
                    self._meta_cache.clear()
                self._meta_cache[key] = (cur, meta)
        return meta

    def _last_accessed(self, sfd: int, principal: str, sid: str) -> int | None:
        st = _fs.lstat_at(LAST_ACCESSED, sfd)
        if st is None or not stat.S_ISREG(st.st_mode):
            return None
        key = (principal, sid)
        cur = _fs.ident(st)
        with self._cache_lock:
            cached = self._la_cache.get(key)
        if cached is not None and cached[0] == cur:
            return cached[1]
        t = _fs.now_ns()
        got = _fs.read_small(LAST_ACCESSED, sfd, 32)
        value: int | None = None
        if got is not None:
            text = got[0].strip()
            if text.isdigit():
                value = int(text)
            if _fs.ident(got[1]) == cur and not _fs.racy(got[1], t, layout.RACY_MARGIN_NS):
                with self._cache_lock:
                    if len(self._la_cache) >= _MAX_META_CACHE:
                        self._la_cache.clear()
                    self._la_cache[key] = (cur, value)
        return value

    def _look_in(self, sfd: int, principal: str, sid: str, now_ms: int) -> Look:
        """Validate one state directory cheaply (stats + cached metadata; no payload hash)."""
        meta = self._load_meta(sfd, principal, sid)
        pin = _fs.lstat_at(PINNED, sfd)
        pinned = pin is not None and stat.S_ISREG(pin.st_mode)
        if meta is None:
            return Look(Kind.INVALID, pinned=pinned)
        pst = _fs.lstat_at(PAYLOAD, sfd)
        if pst is None or not stat.S_ISREG(pst.st_mode) or pst.st_size != meta.size:
            return Look(Kind.INVALID, meta=meta, pinned=pinned)
        if pin is not None and not pinned:
            return Look(Kind.INVALID, meta=meta)
        record = meta.record(pinned=pinned, last_accessed_unix_ms=self._last_accessed(sfd, principal, sid))
        kind = Kind.EXPIRED if record.is_expired(now_ms) else Kind.OK
        return Look(kind, record=record, meta=meta, pinned=pinned)

    def _look(self, pfd: int, principal: str, sid: str, now_ms: int) -> Look:
        """Read-only validation of ``sid``; deep suspects and malformed entries are invalid.

        A valid look is remembered under the ``stat`` identity of the state directory and
        reused (expiry re-evaluated at ``now_ms``) while that identity is unchanged: every
        change a store writer makes to a state, in any process (commit, pin, unpin, access
        time, removal), adds, renames or removes an entry of that directory, so it changes
        the identity. A directory changed within the racy margin is not remembered. Bytes
        rewritten in place (tampering) are found by load verification and reconciliation,
        which mark the state suspect; suspects are applied on every look, cached or not.
        A remembered :class:`Look` is shared between callers: treat it as read-only.
        """
        try:
            st = os.stat(sid, dir_fd=pfd, follow_symlinks=False)
        except OSError:
            return Look(Kind.ABSENT)
        if not stat.S_ISDIR(st.st_mode):
            return Look(Kind.ABSENT)  # a link or non-directory is never followed
        key = (principal, sid)
        cur = _fs.ident(st)
        with self._cache_lock:
            cached = self._look_cache.get(key)
        if cached is not None and cached[0] == cur:
            ok, expired = cached[1], cached[2]
            look = expired if expired.record is not None and expired.record.is_expired(now_ms) else ok
        else:
            look = self._look_uncached(pfd, principal, sid, now_ms, cur)
        if look.kind is _INVALID or self._suspects:
            with self._cache_lock:
                if look.kind is _INVALID:
                    if key not in self._suspects:
                        self._suspects[key] = False
                        self._suspects_changed += 1
                elif self._suspects.get(key):
                    look = Look(Kind.INVALID, meta=look.meta, pinned=look.pinned)
        return look

    def _look_uncached(self, pfd: int, principal: str, sid: str, now_ms: int, seen: _fs.Ident) -> Look:
        t = _fs.now_ns()
        try:
            sfd = _fs.open_dir(sid, pfd)
        except OSError:
            return Look(Kind.ABSENT)
        try:
            look = self._look_in(sfd, principal, sid, now_ms)
            after = os.fstat(sfd)
        except OSError:
            return Look(Kind.INVALID)
        finally:
            os.close(sfd)
        if (
            look.kind in (Kind.OK, Kind.EXPIRED)
            and look.record is not None
            and look.meta is not None
            and _fs.ident(after) == seen
            and not _fs.racy(after, t, layout.RACY_MARGIN_NS)
        ):
            with self._cache_lock:
                if len(self._look_cache) >= _MAX_META_CACHE:
                    self._look_cache.clear()
                record, meta = look.record, look.meta
                self._look_cache[(principal, sid)] = (
                    seen,
                    Look(Kind.OK, record=record, meta=meta, pinned=record.pinned),
                    Look(Kind.EXPIRED, record=record, meta=meta, pinned=record.pinned),
                )
        return look

    def _mark_suspect(self, principal: str, sid: str, *, deep: bool) -> None:
        with self._cache_lock:
            self._suspects[(principal, sid)] = deep or self._suspects.get((principal, sid), False)
            self._suspects_changed += 1

    # ------------------------------------------------------------------ fingerprint index

    def _ids_with_fingerprint(self, principal: str, pfd: int, prompt_fingerprint: str) -> list[str]:
        """Sorted ids whose metadata carried ``prompt_fingerprint`` when indexed (not re-validated)."""
        listing = self._listing(principal, pfd)
        with self._cache_lock:
            index = self._fp_index.get(principal)
        if index is None or index.version != listing.version:
            index = self._refresh_fp_index(principal, pfd, listing, index)
        return sorted(index.by_fp.get(prompt_fingerprint, ()))

    def _refresh_fp_index(self, principal: str, pfd: int, listing: Listing, old: FpIndex | None) -> FpIndex:
        index = FpIndex(version=listing.version)
        if old is not None:
            for sid, fp in old.fp_of.items():
                if sid in listing.id_set:
                    index.fp_of[sid] = fp
                    if fp is not None:
                        index.by_fp.setdefault(fp, set()).add(sid)
        for sid in listing.ids:
            if sid in index.fp_of:
                continue
            try:
                sfd = _fs.open_dir(sid, pfd)
            except OSError:
                continue
            try:
                meta = self._load_meta(sfd, principal, sid)
            finally:
                os.close(sfd)
            if meta is None:
                continue  # not indexed; a later refresh looks again
            index.fp_of[sid] = meta.prompt_fingerprint
            if meta.prompt_fingerprint is not None:
                index.by_fp.setdefault(meta.prompt_fingerprint, set()).add(sid)
        with self._cache_lock:
            self._fp_index[principal] = index
        return index
