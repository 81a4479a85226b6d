"""A listed page is reused only while nothing it was read from changed (``werk_host.store.watch``).

Each test lists once so that the page is kept, then changes something the way a user, another
process or the store itself would, and lists again at once: the change must show.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from werk_host.store import StateStore, layout
from werk_host.store.watch import Watcher

from .helpers import P1, FakeClock, commit
from .test_store_look_cache import _other_process

pytestmark = pytest.mark.skipif(Watcher.shared() is None, reason="no inotify on this platform: pages are not reused")


def _ids(store: StateStore) -> list[str]:
    return [r.id for r in store.list_states(P1)[0]]


def test_an_unchanged_page_is_kept_and_any_change_drops_it(store: StateStore, root: Path) -> None:
    for _ in range(3):
        commit(store)
    first, _ = store.list_states(P1)
    assert store.list_states(P1)[0] is first  # the kept page, not a fresh read
    os.chmod(root / f"p_{P1}", 0o700)  # even an attribute change is a change
    assert store.list_states(P1)[0] is not first


def test_a_file_damaged_by_hand_hides_the_state_at_once(store: StateStore, root: Path) -> None:
    kept, damaged = commit(store), commit(store)
    assert set(_ids(store)) == {kept.id, damaged.id}
    (root / f"p_{P1}" / damaged.id / layout.CHECKSUM).write_text("0" * 64 + "\n")
    assert _ids(store) == [kept.id]


def test_a_file_removed_by_hand_hides_the_state_at_once(store: StateStore, root: Path) -> None:
    kept, damaged = commit(store), commit(store)
    _ids(store)
    (root / f"p_{P1}" / damaged.id / layout.META).unlink()
    assert _ids(store) == [kept.id]


def test_changes_by_another_process_show_at_once(store: StateStore, root: Path) -> None:
    first, second = commit(store), commit(store)
    assert not any(r.pinned for r in store.list_states(P1)[0])
    _other_process(root, [("pin", first.id)])
    assert [r.pinned for r in store.list_states(P1)[0] if r.id == first.id] == [True]
    _other_process(root, [("delete", second.id)])
    assert _ids(store) == [first.id]
    made = _other_process(root, [("commit", "")])["commit"]
    assert set(_ids(store)) == {first.id, made}


def test_this_store_s_own_changes_show_at_once(store: StateStore) -> None:
    first, second = commit(store), commit(store)
    _ids(store)
    store.set_pinned(P1, first.id, True)
    assert [r.pinned for r in store.list_states(P1)[0] if r.id == first.id] == [True]
    store.delete(P1, second.id)
    assert _ids(store) == [first.id]


def test_a_state_that_expires_leaves_the_kept_page(store: StateStore, clock: FakeClock) -> None:
    lasting, brief = commit(store), commit(store, ttl_seconds=5)
    assert set(_ids(store)) == {lasting.id, brief.id}
    clock.now += 6
    assert _ids(store) == [lasting.id]


def test_a_suspect_mark_hides_the_state_at_once(store: StateStore) -> None:
    kept, suspect = commit(store), commit(store)
    _ids(store)
    store._mark_suspect(P1, suspect.id, deep=True)
    assert _ids(store) == [kept.id]


def test_the_next_page_cursor_follows_a_state_beyond_the_page(store: StateStore, clock: FakeClock) -> None:
    a = commit(store)
    b = commit(store, ttl_seconds=5)
    first_two = sorted([a.id, b.id])
    page, after = store.list_states(P1, limit=1)
    assert after is not None and page[0].id == first_two[0]
    clock.now += 6  # the only other state expires: no next page any more
    page, after = store.list_states(P1, limit=1)
    assert [r.id for r in page] == [a.id] and after is None
