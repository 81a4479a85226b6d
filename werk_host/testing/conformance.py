"""The conformance suite every backend plugin runs against the real HTTP app.

A plugin's test suite gets all of it with one fixture (docs/plugin-kit.md)::

    import pytest
    from werk_host.testing.conformance import ConformanceTarget, WerkConformance

    class TestConformance(WerkConformance):
        @pytest.fixture(scope="class")
        @classmethod
        def conformance_target(cls) -> ConformanceTarget:
            return ConformanceTarget(entry_point="mine", model=Path("model.gguf"))

The suite loads the plugin the way a user's install does: through its entry point in the
``werk`` group (the plugin must be installed, e.g. ``pip install -e .``), with every load-time
check (its ``werk-host`` range, names that must agree); a plugin that fails them fails the
suite with the reason ``werk plugins`` would print. It starts a host around the plugin alone
(its own ``WERK_HOME``, an API key, an ephemeral port) and checks, from behaviour seen over HTTP:

* every capability id the plugin declares or reports is a :class:`CapabilityId`, and what it
  reports it declared;
* for every id with a route: ``supported`` works, ``experimental`` answers 428 without the
  opt-in and works with it, ``unsupported`` answers 501, ``unavailable`` answers 503;
* an id whose backing hook the plugin does not implement is reported ``unsupported``;
* a claimed prefill → snapshot → restore → decode round trip reproduces the same text;
* ``identity()`` changes when the backend process is replaced, and old handoffs answer 410;
* a claimed ``runtime.state.restore.cross_restart`` reuses a disk state written before the
  process was replaced (``reuse: required``) and decodes the same text from it; an unclaimed
  one never reuses such a state;
* ``count_tokens`` equals the ``/v1`` usage ``prompt_tokens`` when it is claimed;
* a streamed chat is server-sent events with content deltas, the usage and ``data: [DONE]``;
* with ``stop_backend``, while the backend is away a chat answers 503 with a reason (not the
  host's generic start failure), discovery still answers, and the backend serves again after;
* no error message carries a filesystem path, the API key, a handoff or raw backend output.

A remote backend's target is a manifest without files (``ModelManifest(name, (), backend)``)
with its ``endpoint`` (and ``api_key_env``): the suite then deploys it as a remote instance of
a deployment profile (docs/deployments.md, "Remote instances") instead of registering a model.

Statuses are read right before each check: they are evidence and may change as the backend
runs (llama.cpp's functional probe runs on the first opted-in prefill).
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Iterator
from typing import ClassVar

import pytest
from pydantic import JsonValue

from werk_host import hookspecs
from werk_host.protocol import CapabilityId, CapabilityStatus
from werk_host.testing.conformance_target import (
    ConformanceHost,
    ConformanceTarget,
    load_target,
    served_target,
    stream_answer,
)

__all__ = ["HOOKS_BEHIND", "ConformanceHost", "ConformanceTarget", "WerkConformance", "expected_outcome", "load_target"]

#: The operation hooks a capability cannot work without. A plugin that does not implement
#: one of them must report the capability ``unsupported`` (or leave it out).
HOOKS_BEHIND: dict[CapabilityId, tuple[str, ...]] = {
    CapabilityId.PD_PREFILL: (hookspecs.werk_prefill.__name__,),
    CapabilityId.PD_HANDOFF: (hookspecs.werk_prefill.__name__, hookspecs.werk_decode.__name__),
    CapabilityId.PD_DECODE: (hookspecs.werk_decode.__name__,),
    CapabilityId.PERSISTENCE: (hookspecs.werk_snapshot.__name__, hookspecs.werk_compat_key.__name__),
    CapabilityId.RESTORE: (hookspecs.werk_decode.__name__, hookspecs.werk_compat_key.__name__),
    CapabilityId.CROSS_RESTART: (hookspecs.werk_decode.__name__, hookspecs.werk_compat_key.__name__),
    CapabilityId.TIER_DISK: (hookspecs.werk_snapshot.__name__,),
    CapabilityId.TIER_RAM: (hookspecs.werk_state_move.__name__,),
    CapabilityId.TIER_VRAM: (hookspecs.werk_state_move.__name__,),
    CapabilityId.EXPERTS: (hookspecs.werk_list_experts.__name__, hookspecs.werk_expert_action.__name__),
    CapabilityId.TOKEN_COUNT: (hookspecs.werk_count_tokens.__name__,),
    CapabilityId.CHAT_LIMITS: (hookspecs.werk_chat_limits.__name__,),
    CapabilityId.REASONING: (hookspecs.werk_reasoning_profile.__name__,),
    CapabilityId.PLACEMENT: (hookspecs.werk_deployment_plan.__name__,),
}

#: A path-like run of two or more segments (``/tmp/x/model.gguf``), not ``prefill/decode``.
_PATH = re.compile(r"(?<![\w.])/(?:[\w.-]+/)+[\w.-]+")
_LEAK_MARKERS = ("Traceback", 'File "', "llama_", "ggml_", "srv  ")

PROMPT = "The conformance suite checks that behaviour matches every reported status."
MESSAGES: list[JsonValue] = [{"role": "user", "content": "Say hello to the conformance suite."}]


Outcome = int | None  # an expected HTTP error status, or None for success


def expected_outcome(host: ConformanceHost, gates: tuple[CapabilityId, ...], opted_in: bool) -> tuple[Outcome, ...]:
    """The outcomes the reported statuses allow for a request gated by ``gates`` in order."""
    statuses = host.statuses()
    for cap_id in gates:
        status = statuses[cap_id]
        if status is CapabilityStatus.SUPPORTED:
            continue
        if status is CapabilityStatus.EXPERIMENTAL:
            if not opted_in:
                return (428,)
            continue
        if status is CapabilityStatus.UNAVAILABLE:
            if opted_in and host.probe_on_use(cap_id):
                return (None, 503)  # the opted-in request runs the backend's functional probe
            return (503,)
        return (501,)
    return (None,)


def _matches(status: int, allowed: tuple[Outcome, ...]) -> bool:
    return any((want is None and 200 <= status < 300) or want == status for want in allowed)


def _data(doc: dict[str, JsonValue]) -> dict[str, JsonValue]:
    data = doc.get("data")
    assert isinstance(data, dict), doc
    return data


class WerkConformance:
    """Subclass in a plugin's tests and provide a class-scoped ``conformance_target`` fixture."""

    #: Chat-planning routes and their capability (they take no opt-in: experimental → 428).
    PLANNING: ClassVar[tuple[tuple[CapabilityId, str, str], ...]] = (
        (CapabilityId.TOKEN_COUNT, "POST", "/werk/v1/chat/count_tokens"),
        (CapabilityId.ADMISSION, "POST", "/werk/v1/chat/admission"),
        (CapabilityId.CHAT_LIMITS, "GET", "/werk/v1/chat/limits"),
        (CapabilityId.REASONING, "GET", "/werk/v1/chat/reasoning"),
    )

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_host(
        cls, conformance_target: ConformanceTarget, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[ConformanceHost]:
        home = tmp_path_factory.mktemp("werk-conformance") / "home"
        with served_target(conformance_target, home) as host:
            yield host

    # -- ids ------------------------------------------------------------------------------
    def test_declared_and_reported_ids_are_capability_ids(self, conformance_host: ConformanceHost) -> None:
        host = conformance_host
        plugins = host.host.plugins
        adapter = host.adapter
        raw = plugins.dispatch(hookspecs.werk_capabilities.__name__, adapter) or {}
        assert isinstance(raw, dict), "werk_capabilities must return a mapping"
        known = set(CapabilityId)
        unknown = sorted(str(k) for k in raw if k not in known)
        assert not unknown, f"unknown capability ids reported: {unknown}"
        declared: set[CapabilityId] = set()
        for factory in plugins.adapter_factories(host.host.config):
            if factory.owner == plugins.owner_of(adapter):
                bad = sorted(str(c) for c in factory.capabilities if c not in known)
                assert not bad, f"unknown capability ids declared: {bad}"
                declared |= {CapabilityId(c) for c in factory.capabilities}
        undeclared = sorted(str(k) for k in raw if k not in declared)
        assert not undeclared, f"reported but not declared on the AdapterFactory: {undeclared}"
        record = next(r for r in plugins.records if r.name == plugins.owner_of(adapter))
        assert record.status == "loaded" and not record.problems, record.problems

    def test_ids_without_their_hooks_are_unsupported(self, conformance_host: ConformanceHost) -> None:
        host = conformance_host
        implemented = host.host.plugins.operations_of(host.adapter)
        statuses = host.statuses()
        for cap_id, hooks in HOOKS_BEHIND.items():
            missing = [h for h in hooks if h not in implemented]
            if missing:
                assert statuses[cap_id] is CapabilityStatus.UNSUPPORTED, (
                    f"{cap_id} is {statuses[cap_id]} but the plugin does not implement {missing}"
                )

    # -- status ↔ behaviour -------------------------------------------------------------------
    def _prefill(
        self, host: ConformanceHost, opted_in: bool, mode: str = "ephemeral", reuse: str = "disabled"
    ) -> tuple[int, dict[str, JsonValue]]:
        body: JsonValue = {
            "model_id": host.model_name,
            "input": {"type": "text", "text": PROMPT},
            "policy": {"mode": mode, "reuse": reuse},
            "allow_experimental": opted_in,
        }
        return host.call("POST", "/werk/v1/prefill", body)

    def _check(self, status: int, doc: object, allowed: tuple[Outcome, ...], what: str) -> None:
        assert _matches(status, allowed), f"{what}: got {status}, statuses allow {allowed}: {doc}"

    @pytest.mark.parametrize("opted_in", [False, True], ids=["no-opt-in", "opt-in"])
    def test_prefill_follows_status(self, conformance_host: ConformanceHost, opted_in: bool) -> None:
        host = conformance_host
        gates = (CapabilityId.PD_PREFILL, CapabilityId.PD_HANDOFF)
        allowed = expected_outcome(host, gates, opted_in)
        status, doc = self._prefill(host, opted_in)
        self._check(status, doc, allowed, "ephemeral prefill")

    @pytest.mark.parametrize("opted_in", [False, True], ids=["no-opt-in", "opt-in"])
    def test_disk_prefill_follows_status(self, conformance_host: ConformanceHost, opted_in: bool) -> None:
        host = conformance_host
        gates = (CapabilityId.PD_PREFILL, CapabilityId.PD_HANDOFF, CapabilityId.PERSISTENCE, CapabilityId.TIER_DISK)
        allowed = expected_outcome(host, gates, opted_in)
        status, doc = self._prefill(host, opted_in, mode="disk")
        self._check(status, doc, allowed, "disk prefill")

    @pytest.mark.parametrize("opted_in", [False, True], ids=["no-opt-in", "opt-in"])
    def test_decode_follows_status(self, conformance_host: ConformanceHost, opted_in: bool) -> None:
        host = conformance_host
        status, doc = self._prefill(host, True)
        allowed = expected_outcome(host, (CapabilityId.PD_DECODE,), opted_in)
        if status == 200:
            handoff = _data(doc)["handoff"]
        elif None in allowed:
            pytest.skip("decode may work, but the backend cannot prefill, so there is no handoff to decode")
        else:  # the gate answers before any handoff is looked at
            handoff = "never-issued-" + secrets.token_hex(8)
        body: dict[str, JsonValue] = {"handoff": handoff, "max_tokens": 4, "temperature": 0}
        status, doc = host.call("POST", "/werk/v1/decode", {**body, "allow_experimental": opted_in})
        self._check(status, doc, allowed, "decode")
        if status == 428:  # a refused decode must not burn the handoff
            status, doc = host.call("POST", "/werk/v1/decode", {**body, "allow_experimental": True})
            assert status == 200, doc

    @pytest.mark.parametrize("opted_in", [False, True], ids=["no-opt-in", "opt-in"])
    def test_experts_follow_status(self, conformance_host: ConformanceHost, opted_in: bool) -> None:
        host = conformance_host
        allowed = expected_outcome(host, (CapabilityId.EXPERTS,), opted_in)
        listing = allowed
        if host.statuses()[CapabilityId.EXPERTS] is CapabilityStatus.EXTERNALLY_MANAGED:
            listing = (None,)  # externally managed permits the read-only listing (docs/experts.md)
        params = {"allow_experimental": "true" if opted_in else "false"}
        status, doc = host.call("GET", "/werk/v1/experts", params=params)
        self._check(status, doc, listing, "expert listing")
        if status != 200:
            return
        experts = _data(doc)["experts"]
        assert isinstance(experts, list)
        if not experts:
            return
        first = experts[0]
        assert isinstance(first, dict)
        body: JsonValue = {
            "model_id": first["model_id"],
            "expert_ids": [first["id"]],
            "action": "pin",
            "dry_run": True,
            "allow_experimental": opted_in,
        }
        status, doc = host.call("POST", "/werk/v1/experts/actions", body)
        self._check(status, doc, allowed, "expert pin dry run")
        if status == 200:
            assert _data(doc)["dry_run"] is True

    @pytest.mark.parametrize("tier", ["ram", "vram"])
    @pytest.mark.parametrize("opted_in", [False, True], ids=["no-opt-in", "opt-in"])
    def test_tier_moves_follow_status(self, conformance_host: ConformanceHost, tier: str, opted_in: bool) -> None:
        host = conformance_host
        status, doc = self._prefill(host, True, mode="disk")
        state_id = _data(doc).get("state_id") if status == 200 else None
        if not isinstance(state_id, str):
            pytest.skip("the backend stores no disk state to move")
        allowed = expected_outcome(host, (CapabilityId.tier(tier),), opted_in)
        body: JsonValue = {"action": "promote", "target_tier": tier, "dry_run": True, "allow_experimental": opted_in}
        status, doc = host.call("POST", f"/werk/v1/states/{state_id}/actions", body)
        self._check(status, doc, allowed, f"promote to {tier} (dry run)")

    @pytest.mark.parametrize("cap_id", [p[0] for p in PLANNING], ids=[p[0].value for p in PLANNING])
    def test_chat_planning_follows_status(self, conformance_host: ConformanceHost, cap_id: CapabilityId) -> None:
        host = conformance_host
        _, method, path = next(p for p in self.PLANNING if p[0] is cap_id)
        allowed = expected_outcome(host, (cap_id,), False)
        params = {"model": host.model_name}
        if cap_id is CapabilityId.REASONING:
            params["max_output_tokens"] = "64"
        if method == "POST":
            status, doc = host.call(method, path, {"model": host.model_name, "messages": MESSAGES, "max_tokens": 8})
        else:
            status, doc = host.call(method, path, params=params)
        self._check(status, doc, allowed, path)

    # -- claimed behaviour is real ---------------------------------------------------------------
    def test_count_tokens_equals_v1_usage(self, conformance_host: ConformanceHost) -> None:
        host = conformance_host
        if host.statuses()[CapabilityId.TOKEN_COUNT] is not CapabilityStatus.SUPPORTED:
            pytest.skip("api.chat.token_count is not claimed")
        status, doc = host.call("POST", "/werk/v1/chat/count_tokens", {"model": host.model_name, "messages": MESSAGES})
        assert status == 200, doc
        counted = _data(doc)["input_tokens"]
        body: JsonValue = {"model": host.model_name, "messages": MESSAGES, "max_tokens": 2, "temperature": 0}
        status, doc = host.api.call("POST", "/v1/chat/completions", body)
        assert status == 200, doc
        usage = doc.get("usage")
        assert isinstance(usage, dict), doc
        assert usage["prompt_tokens"] == counted

    def test_snapshot_restore_round_trip(self, conformance_host: ConformanceHost) -> None:
        host = conformance_host
        status, first = self._prefill(host, True, mode="disk", reuse="disabled")
        claimed = host.statuses()
        needed = (CapabilityId.PERSISTENCE, CapabilityId.RESTORE, CapabilityId.PD_DECODE)
        usable = (CapabilityStatus.SUPPORTED, CapabilityStatus.EXPERIMENTAL)
        if status != 200 or any(claimed[c] not in usable for c in needed):
            pytest.skip("persistence, restore and decode are not all claimed")
        decode: dict[str, JsonValue] = {"max_tokens": 6, "temperature": 0, "seed": 7, "allow_experimental": True}
        status, out1 = host.call("POST", "/werk/v1/decode", {"handoff": _data(first)["handoff"], **decode})
        assert status == 200, out1
        status, again = self._prefill(host, True, mode="disk", reuse="required")
        assert status == 200, again
        assert _data(again)["reused"] is True
        assert _data(again)["state_id"] == _data(first)["state_id"]
        status, out2 = host.call("POST", "/werk/v1/decode", {"handoff": _data(again)["handoff"], **decode})
        assert status == 200, out2
        assert _data(out2)["text"] == _data(out1)["text"]

    def test_replaced_process_changes_identity_and_expires_handoffs(
        self, conformance_host: ConformanceHost, conformance_target: ConformanceTarget
    ) -> None:
        host = conformance_host
        if conformance_target.replace_process is None:
            pytest.skip("the target gives no way to replace the backend process")
        status, doc = self._prefill(host, True)
        if status != 200:
            pytest.skip("the backend cannot prefill, so there is no handoff to expire")
        before = host.adapter.identity()
        conformance_target.replace_process(host.adapter)
        assert host.adapter.identity() != before
        body: JsonValue = {"handoff": _data(doc)["handoff"], "max_tokens": 2, "allow_experimental": True}
        status, answer = host.call("POST", "/werk/v1/decode", body)
        assert status == 410, answer
        status, doc = self._prefill(host, True)  # the backend serves again
        assert status == 200, doc

    def test_cross_restart_restore_follows_status(
        self, conformance_host: ConformanceHost, conformance_target: ConformanceTarget
    ) -> None:
        host = conformance_host
        if conformance_target.replace_process is None:
            pytest.skip("the target gives no way to replace the backend process")
        status, first = self._prefill(host, True, mode="disk", reuse="disabled")
        if status != 200 or not isinstance(_data(first).get("state_id"), str):
            pytest.skip("the backend stores no disk state")
        decode: dict[str, JsonValue] = {"max_tokens": 6, "temperature": 0, "seed": 7, "allow_experimental": True}
        status, out1 = host.call("POST", "/werk/v1/decode", {"handoff": _data(first)["handoff"], **decode})
        assert status == 200, out1
        conformance_target.replace_process(host.adapter)
        other: JsonValue = {
            "model_id": host.model_name,
            "input": {"type": "text", "text": "The replaced backend process serves again."},
            "policy": {"mode": "ephemeral"},
            "allow_experimental": True,
        }
        status, doc = host.call("POST", "/werk/v1/prefill", other)  # the new process serves (and probes)
        assert status == 200, doc
        claimed = host.statuses()[CapabilityId.CROSS_RESTART]
        status, again = self._prefill(host, True, mode="disk", reuse="required")
        if claimed in (CapabilityStatus.SUPPORTED, CapabilityStatus.EXPERIMENTAL):
            assert status == 200, again
            assert _data(again)["reused"] is True
            status, out2 = host.call("POST", "/werk/v1/decode", {"handoff": _data(again)["handoff"], **decode})
            assert status == 200, out2
            assert _data(out2)["text"] == _data(out1)["text"]
        else:
            assert status == 409, f"{CapabilityId.CROSS_RESTART} is {claimed}, yet: {status} {again}"

    def test_streamed_chat_is_server_sent_events(self, conformance_host: ConformanceHost) -> None:
        host = conformance_host
        if hookspecs.werk_chat_completion.__name__ not in host.host.plugins.operations_of(host.adapter):
            pytest.skip("the backend serves no chat")
        body: JsonValue = {
            "model": host.model_name,
            "messages": MESSAGES,
            "max_tokens": 4,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        status, kind, events = stream_answer(host, "/v1/chat/completions", body)
        assert status == 200, events
        assert kind.startswith("text/event-stream"), kind
        assert events and events[-1] == "[DONE]", f"the stream does not end with data: [DONE]: {events[-3:]}"
        chunks = [json.loads(e) for e in events[:-1]]
        assert all(isinstance(c, dict) and c.get("object") == "chat.completion.chunk" for c in chunks), chunks
        deltas = [c["choices"][0].get("delta") for c in chunks if c.get("choices")]
        assert deltas and all(isinstance(d, dict) for d in deltas), chunks
        finishes = [c["choices"][0].get("finish_reason") for c in chunks if c.get("choices")]
        assert finishes[-1] in ("stop", "length"), finishes
        usage = next((c["usage"] for c in reversed(chunks) if isinstance(c.get("usage"), dict)), None)
        assert usage is not None, "the stream carries no usage although the request asked for it"
        assert usage["completion_tokens"] >= 1 and usage["prompt_tokens"] >= 1, usage

    def test_backend_taken_away_fails_with_a_reason(
        self, conformance_host: ConformanceHost, conformance_target: ConformanceTarget
    ) -> None:
        host = conformance_host
        if conformance_target.stop_backend is None:
            pytest.skip("the target gives no way to take the backend away")
        chat: dict[str, JsonValue] = {"model": host.model_name, "messages": MESSAGES, "max_tokens": 2}
        with conformance_target.stop_backend(host.adapter):
            status, doc = host.api.call("POST", "/v1/chat/completions", chat)
            streamed, _, events = stream_answer(host, "/v1/chat/completions", {**chat, "stream": True})
            listed, listing = host.call("GET", "/werk/v1/capabilities")
        assert listed == 200, listing  # discovery answers while the backend is away
        assert status in (200, 503) and streamed in (200, 503), (status, doc, streamed, events)
        if status == 503:
            error = doc.get("error")
            assert isinstance(error, dict), doc
            message = str(error.get("message", ""))
            host.errors.append(message)
            assert message and "server log" not in message, f"the answer does not name the reason: {message!r}"
        if streamed == 503:
            host.errors.append(events[0] if events else "")
        deadline = time.monotonic() + 30
        while True:  # back: it serves again (a remote backend re-probes after a short while)
            status, doc = host.api.call("POST", "/v1/chat/completions", chat)
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert status == 200, f"the backend does not serve again after it came back: {doc}"

    # -- errors ---------------------------------------------------------------------------------
    def test_errors_leak_nothing(self, conformance_host: ConformanceHost) -> None:
        host = conformance_host
        host.call("POST", "/werk/v1/prefill", {"model_id": "no-such-model", "input": {"type": "text", "text": "x"}})
        host.call("POST", "/werk/v1/decode", {"handoff": "forged-" + secrets.token_hex(16), "allow_experimental": True})
        huge: list[JsonValue] = [{"role": "user", "content": "word " * 20_000}]
        host.call("POST", "/werk/v1/chat/count_tokens", {"model": host.model_name, "messages": huge})
        status, doc = host.api.call("POST", "/v1/chat/completions", {"messages": huge, "max_tokens": 4})
        if status >= 400 and isinstance(doc.get("error"), dict):
            error = doc["error"]
            assert isinstance(error, dict)
            host.errors.append(str(error.get("message", "")))
        assert host.errors, "the suite saw no error message to check"
        secrets_seen = [host.key, *host.secrets, str(host.home), *host.model_paths, *host.handoffs]
        for message in host.errors:
            for secret in secrets_seen:
                assert secret not in message, f"an error message leaks {secret!r}: {message!r}"
            assert not _PATH.search(message), f"an error message carries a path: {message!r}"
            for marker in _LEAK_MARKERS:
                assert marker not in message, f"an error message carries raw backend output: {message!r}"
