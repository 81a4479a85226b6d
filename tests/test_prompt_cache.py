"""Automatic prompt caches, the host's side (werk_host/service/promptcache.py; docs/prompt-cache.md),
over the reference backend's slots (werk_host/testing/reference_cache.py) behind a real server.
The llama.cpp plugin's suite runs the same rules against a real llama-server."""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from werk_host.cli import cache as cache_cli
from werk_host.client import WerkProtocolClient
from werk_host.testing.api import Api
from werk_host.testing.host import Host
from werk_host.testing.hosts import backend_host, running, settled
from werk_host.testing.reference import MemoryBackendPlugin

KEY_A = "sk-werk-prompt-cache-a-123456"
KEY_B = "sk-werk-prompt-cache-b-654321"
#: 1,200 words: above the 1,024-token threshold in the reference tokenizer (a token is a word).
DOCUMENT = " ".join(f"w{i}" for i in range(1200))
#: What one ``ask`` leaves in its entry: its 1,204 prompt tokens and the 4 answer tokens.
PROMPT_CACHE_TOKENS = 1204 + 4


@contextmanager
def serve(home: Path, slots: int = 1, **config: Any) -> Iterator[tuple[Host, MemoryBackendPlugin, Api, Api]]:
    host, plugin = backend_host(
        home, api_keys=(KEY_A, KEY_B), adapter_kwargs={"prompt_cache": slots, "context_tokens": 8192}, **config
    )
    with running(host) as base:
        yield host, plugin, Api(base, KEY_A), Api(base, KEY_B)


def ask(api: Api, document: str = DOCUMENT, question: str = "what now") -> int:
    """The cached prompt tokens the backend reported for one chat."""
    body = {"messages": [{"role": "user", "content": f"{document} {question}"}], "max_tokens": 4}
    status, answer = api.post("/v1/chat/completions", body)
    assert status == 200, answer
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])


def entries(home: Path) -> list[Path]:
    return sorted(home.glob("prompt-cache/*/p_*/st_*/payload.bin"))


def test_a_restarted_backend_gets_the_prefix_back(tmp_path: Path) -> None:
    with serve(tmp_path) as (host, plugin, a, _b):
        assert ask(a) == 0
        settled(host)
        assert len(entries(tmp_path)) == 1
        (adapter,) = plugin.adapters
        adapter.restart()  # the slots are gone
        assert ask(a, question="and then") == 1200 + 1  # restored: the role token and the document
        counters = settled(host)
    assert counters.prompt_cache_hits == 1 and counters.prompt_cache_restored_tokens == 1201
    # the saved entry (1,204 prompt + 4 answer tokens) already holds the whole second prompt
    assert counters.prompt_cache_saves == 1 and len(entries(tmp_path)) == 1


def test_every_turn_of_a_conversation_is_kept(tmp_path: Path) -> None:
    turns: list[dict[str, str]] = [{"role": "user", "content": DOCUMENT}]
    with serve(tmp_path) as (host, plugin, a, _b):
        for n in range(3):  # each turn adds a few tokens only: less than a block
            status, answer = a.post("/v1/chat/completions", {"messages": turns, "max_tokens": 4})
            assert status == 200
            turns += [answer["choices"][0]["message"], {"role": "user", "content": f"and {n}?"}]
            last_prompt = answer["usage"]["prompt_tokens"]
            settled(host)
        assert settled(host).prompt_cache_saves == 3 and len(entries(tmp_path)) == 1  # the latest turn
        (adapter,) = plugin.adapters
        adapter.restart()
        status, answer = a.post("/v1/chat/completions", {"messages": turns, "max_tokens": 4})
    # the third turn's whole prompt came back (the reference slot holds the answer's words
    # without the role token the next prompt renders before them)
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == last_prompt


def test_short_prompts_are_neither_saved_nor_restored(tmp_path: Path) -> None:
    with serve(tmp_path) as (host, _plugin, a, _b):
        ask(a, document="a short one")
        assert settled(host).prompt_cache_saves == 0
    assert entries(tmp_path) == []


def test_keys_share_no_slot_and_no_entry(tmp_path: Path) -> None:
    with serve(tmp_path) as (host, plugin, a, b):
        assert ask(a) == 0
        assert ask(b) == 0  # the same document in the same slot: erased before B's request
        settled(host)
        (adapter,) = plugin.adapters
        adapter.restart()
        assert ask(b) > 0  # B's own entry
        adapter.restart()
        assert ask(a) > 0  # A's own entry, never B's


def test_racing_keys_never_see_each_others_prefix(tmp_path: Path) -> None:
    seen: dict[str, list[int]] = {"a": [], "b": []}
    with serve(tmp_path, slots=2) as (host, plugin, a, b):

        def run(name: str, api: Api) -> None:
            for n in range(6):
                seen[name].append(ask(api, document=f"{name} " + DOCUMENT, question=f"q{n}"))

        threads = [threading.Thread(target=run, args=("a", a)), threading.Thread(target=run, args=("b", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        settled(host)
    # the documents differ in their first word: any reuse across keys would be 1 token (the
    # role) at most; within a key, the whole document is reused after the first turn
    assert all(c in (0, 1) or c >= 1201 for c in seen["a"] + seen["b"])
    assert max(seen["a"]) >= 1201 and max(seen["b"]) >= 1201


def test_a_restore_the_backend_did_not_reuse_turns_the_mechanism_off(tmp_path: Path) -> None:
    with serve(tmp_path) as (host, plugin, a, _b):
        ask(a)
        settled(host)
        (adapter,) = plugin.adapters
        adapter.restart()
        adapter.fail.add("prompt_unused")
        assert ask(a) == 0  # restored, then evaluated in full: never claimed as reuse
        counters = settled(host)
        cache = adapter.open_prompt_cache()
        assert cache is not None and cache.unavailable_reason() is not None
    assert counters.prompt_cache_hits == 0 and counters.prompt_cache_misses == 2  # the cold one, the unreused one
    assert entries(tmp_path) == []  # the unreused entry is gone, and nothing new was saved


def test_a_failed_save_loses_speed_only(tmp_path: Path) -> None:
    with serve(tmp_path) as (host, plugin, a, _b):
        (adapter,) = plugin.adapters
        adapter.fail.add("prompt_save")
        assert ask(a) == 0  # answered all the same
        assert settled(host).prompt_cache_saves == 0
    assert entries(tmp_path) == []


def test_the_budget_evicts_the_least_recently_used(tmp_path: Path) -> None:
    with serve(tmp_path) as (host, _plugin, a, _b):
        ask(a)
        settled(host)
    one = entries(tmp_path)[0].stat().st_size
    home = tmp_path / "small"
    with serve(home, prompt_cache_budget=one * 3 // 2) as (host, plugin, a, _b):
        for n in range(3):
            ask(a, document=f"part{n} " + DOCUMENT)
            settled(host)
            assert sum(p.stat().st_size for p in entries(home)) <= one * 3 // 2
        (adapter,) = plugin.adapters
        adapter.restart()
        assert ask(a, document="part2 " + DOCUMENT) > 1  # the latest was kept
        adapter.restart()
        assert ask(a, document="part0 " + DOCUMENT) <= 1  # the oldest was evicted


def cli(capsys: pytest.CaptureFixture[str], home: Path, *argv: str) -> tuple[int, Any]:
    parser = argparse.ArgumentParser()
    cache_cli.register(parser.add_subparsers())
    args = parser.parse_args(["cache", *argv, "--home", str(home), "--json"])
    code = args.handler(args)
    return code, json.loads(capsys.readouterr().out)


def test_werk_cache_lists_and_purges_prompt_caches(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with serve(tmp_path) as (host, _plugin, a, b):
        ask(a)
        ask(b, document="other " + DOCUMENT)
        settled(host)
    code, listed = cli(capsys, tmp_path, "list")
    prompts = [e for e in listed["prompt_caches"] if e["kind"] == "state"]
    assert code == 0 and len(prompts) == 2 and listed["totals"]["prompt_caches"] == 2
    assert len({e["principal_prefix"] for e in prompts}) == 2  # one per key
    first = prompts[0]["id"]
    assert first.startswith("prompt:tiny/st_")
    code, preview = cli(capsys, tmp_path, "purge", first, "--dry-run")
    assert code == 0 and preview["dry_run"] and len(entries(tmp_path)) == 2
    code, _ = cli(capsys, tmp_path, "purge", first)
    assert code == 0 and len(entries(tmp_path)) == 1
    code, done = cli(capsys, tmp_path, "purge", "--all")
    assert code == 0 and done["prompt_caches_removed"] == 1 and entries(tmp_path) == []


def capability(api: Api) -> dict[str, Any]:
    status, listing = api.get("/werk/v1/capabilities")
    assert status == 200
    (found,) = [c for c in listing["data"] if c["id"] == "runtime.state.prompt_cache"]
    return dict(found)


def test_the_capability_follows_the_evidence(tmp_path: Path) -> None:
    with serve(tmp_path) as (host, plugin, a, _b):
        report = capability(a)
        assert report["status"] == "experimental" and report["operations"] == ["automatic_reuse"]
        ask(a)
        settled(host)
        (adapter,) = plugin.adapters
        adapter.restart()
        adapter.fail.add("prompt_unused")
        ask(a)
        settled(host)
        time.sleep(1.1)  # capability evidence is kept for a second
        report = capability(a)
        assert report["status"] == "unavailable" and "not reused" in report["detail"]
    with serve(tmp_path / "off", prompt_cache_budget=0) as (_host, _plugin, a, _b):
        assert capability(a)["status"] == "unavailable"
    with serve(tmp_path / "none", slots=0) as (_host, _plugin, a, _b):
        assert capability(a)["status"] == "unsupported"


def test_the_bundled_client_accepts_ids_it_does_not_know(tmp_path: Path) -> None:
    with serve(tmp_path) as (_host, _plugin, a, _b):
        client = WerkProtocolClient(a.base, api_key=KEY_A)
        answer = client._request("GET", "/werk/v1/capabilities")
        newer = [*answer.data, {"id": "runtime.something.newer", "status": "supported", "detail": "", "operations": []}]
        client._request = lambda *_args, **_kw: type(answer)(newer, answer.request_id, answer.status)  # type: ignore[method-assign]
        ids = {c.id.value for c in client.capabilities()}
    assert "runtime.state.prompt_cache" in ids and "runtime.something.newer" not in ids


def test_a_new_process_is_warmed_with_the_most_recent_entry(tmp_path: Path) -> None:
    with serve(tmp_path) as (host, plugin, a, b):
        ask(b, document="older " + DOCUMENT)
        settled(host)
        ask(a)
        settled(host)
        deployments = host.fleet.deployments
        assert deployments is not None
        (instance,) = deployments.instances.values()
        assert instance.stop("test: a keep-alive stop")
        instance.use()  # a new process: its slots are empty; the prewarm restores A's entry
        counters = settled(host)
        assert counters.prompt_cache_prewarms == 1
        hits = counters.prompt_cache_hits
        assert ask(a, question="and then") == 1201  # found in the slot: no restore on the request's path
        counters = settled(host)
        assert counters.prompt_cache_hits == hits and counters.prompt_cache_prewarms == 1
        assert ask(b, document="older " + DOCUMENT) > 1  # B's own entry, restored over A's erased slot


# -- /werk/v1/prompt-caches (werk_host/service/cacheentries.py; docs/prompt-cache.md, "Routes") --------

ROUTE = "/werk/v1/prompt-caches"


def listed(api: Api, **query: str) -> list[dict[str, object]]:
    status, doc = api.get(ROUTE, **query)
    assert status == 200, doc
    assert doc["data"]["truncated"] is False
    return list(doc["data"]["entries"])


def act(api: Api, entry_id: object, action: str, dry_run: bool) -> tuple[int, dict[str, object]]:
    return api.post(f"{ROUTE}/{entry_id}/actions", {"action": action, "dry_run": dry_run})


def test_a_key_lists_and_acts_on_its_own_entries_only(tmp_path: Path) -> None:
    with serve(tmp_path) as (host, plugin, a, b):
        ask(a)
        ask(b, document="b " + DOCUMENT)
        settled(host)
        (mine,) = listed(a)
        (theirs,) = listed(b)
        assert mine["id"] != theirs["id"] and mine["instance"] == theirs["instance"]
        assert mine["prompt_tokens"] == PROMPT_CACHE_TOKENS
        assert mine["pinned"] is False and mine["reusable"] is True
        assert isinstance(mine["bytes"], int) and mine["bytes"] > 0
        # another key's entry is not found, for every action, and nothing changed
        for action in ("pin", "unpin", "evict"):
            status, doc = act(b, mine["id"], action, dry_run=False)
            assert status == 404, doc
        status, doc = b.post(f"{ROUTE}/prune", {"selector": {"kind": "ids", "ids": [mine["id"]]}, "dry_run": False})
        assert status == 200 and doc["data"]["matched"] == 0 and doc["data"]["removed"] == 0
        assert listed(a) == [mine] and len(entries(tmp_path)) == 2


def test_a_pin_is_previewed_then_kept_through_a_later_turn(tmp_path: Path) -> None:
    with serve(tmp_path) as (host, plugin, a, _b):
        ask(a)
        settled(host)
        (entry,) = listed(a)
        status, doc = act(a, entry["id"], "pin", dry_run=True)
        assert status == 200 and doc["data"] == {"entry": {**entry, "pinned": True}, "changed": True, "dry_run": True}
        assert listed(a) == [entry]  # the preview changed nothing
        status, doc = act(a, entry["id"], "pin", dry_run=False)
        assert status == 200 and doc["data"]["entry"]["pinned"] is True and doc["data"]["changed"] is True
        # a longer prompt over the same document supersedes an entry; a pinned one stays
        ask(a, question="what now and what next " + " ".join(f"x{i}" for i in range(300)))
        settled(host)
        ids = {e["id"]: e["pinned"] for e in listed(a)}
        assert len(ids) == 2 and ids[entry["id"]] is True
        status, doc = act(a, entry["id"], "unpin", dry_run=False)
        assert status == 200 and doc["data"]["entry"]["pinned"] is False


def test_evict_and_prune_preview_first_then_remove(tmp_path: Path) -> None:
    with serve(tmp_path, slots=2) as (host, plugin, a, _b):
        ask(a)
        ask(a, document="other " + DOCUMENT)
        settled(host)
        first, second = listed(a)
        status, doc = act(a, first["id"], "evict", dry_run=True)
        assert status == 200 and doc["data"]["dry_run"] is True and doc["data"]["changed"] is True
        assert len(listed(a)) == 2
        status, doc = act(a, first["id"], "evict", dry_run=False)
        assert status == 200 and doc["data"]["changed"] is True
        assert listed(a) == [second] and len(entries(tmp_path)) == 1
        selector = {"kind": "all", "confirm": True}
        status, doc = a.post(f"{ROUTE}/prune", {"selector": selector})  # a dry run unless told
        assert status == 200 and doc["data"] == {
            "matched": 1,
            "removed": 0,
            "bytes": second["bytes"],
            "dry_run": True,
        }
        assert listed(a) == [second]
        status, doc = a.post(f"{ROUTE}/prune", {"selector": selector, "dry_run": False})
        assert status == 200 and doc["data"]["removed"] == 1
        assert listed(a) == [] and entries(tmp_path) == []


def test_bad_requests_are_typed_400s_and_nothing_is_touched(tmp_path: Path) -> None:
    with serve(tmp_path) as (host, plugin, a, _b):
        ask(a)
        settled(host)
        (entry,) = listed(a)
        instance, sid = str(entry["id"]).split("/")
        bad = [
            (f"{ROUTE}/{instance}/not-an-entry/actions", {"action": "pin"}),
            (f"{ROUTE}/{instance}/{sid}/actions", {"action": "promote"}),
            (f"{ROUTE}/{instance}/{sid}/actions", {"action": "pin", "extra": 1}),
            (f"{ROUTE}/prune", {"selector": {"kind": "all"}}),
            (f"{ROUTE}/prune", {"selector": {"kind": "filter"}}),
            (f"{ROUTE}/prune", {"selector": {"kind": "ids", "ids": ["../x"]}}),
        ]
        for path, body in bad:
            status, doc = a.post(path, body)
            assert status == 400, (path, body, doc)
            assert doc["error"]["code"] == "invalid_request"
        status, doc = a.get(ROUTE, limit="0")
        assert status == 400, doc
        status, doc = act(a, f"no-such-instance/{sid}", "evict", dry_run=False)
        assert status == 404, doc
        assert not (tmp_path / "prompt-cache" / "no-such-instance").exists()  # no store made
        assert listed(a) == [entry]
        status, doc = Api(a.base, "sk-not-a-key-000000").get(ROUTE)
        assert status == 401, doc
        assert KEY_A not in str(doc)
