"""Every client method against a real host served by waitress (in-memory test backend)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.client.conftest import LIVE_KEY, Live
from werk_host.client import (
    ExperimentalOptInRequiredError,
    ExpiredHandoffError,
    NotFoundError,
    UnauthorizedError,
    UnsupportedError,
    WerkProtocolClient,
)
from werk_host.protocol import (
    Admission,
    AllSelector,
    Capability,
    CapabilityId,
    CapabilityStatus,
    ChatLimits,
    ChatMessage,
    ChatRequest,
    DecodeRequest,
    Deployments,
    ExpertActionRequest,
    ExpertListQuery,
    ExpertPage,
    FilterSelector,
    IdsSelector,
    MemoryReport,
    Message,
    MessagesInput,
    Observability,
    Policy,
    PrefillRequest,
    PruneRequest,
    ReasoningProfile,
    RuntimeInfo,
    StateActionRequest,
    StateListQuery,
    TextInput,
    Tier,
    TokenCount,
)
from werk_host.testing import hosts
from werk_host.testing.reference import EXPERIMENTAL_STATE

MODEL = "tiny"


def prefill(client: WerkProtocolClient, text: str = "one two three four five", mode: str = "disk") -> tuple[str, str]:
    result = client.prefill(
        PrefillRequest(
            model_id=MODEL,
            input=TextInput(type="text", text=text),
            policy=Policy(mode=mode),
            allow_experimental=True,
        )
    )
    assert result.state_id is not None
    return result.handoff.get_secret_value(), result.state_id


def test_discovery_routes(live: Live) -> None:
    client = WerkProtocolClient(live.url, LIVE_KEY)
    info = client.info()
    assert isinstance(info, RuntimeInfo) and (info.protocol.major, info.protocol.minor) == (1, 0)
    capabilities = client.capabilities()
    assert capabilities and all(isinstance(c, Capability) for c in capabilities)
    by_id = {c.id: c.status for c in capabilities}
    assert by_id["runtime.pd.prefill"] is CapabilityStatus.EXPERIMENTAL
    assert isinstance(client.memory(), MemoryReport)
    assert isinstance(client.observability(), Observability)
    assert isinstance(client.deployments(), Deployments)


def test_prefill_decode_and_state_lifecycle(live: Live) -> None:
    client = WerkProtocolClient(live.url, LIVE_KEY)
    handoff, state_id = prefill(client)

    page = client.list_states()
    assert [s.id for s in page.states] == [state_id]
    assert client.list_states(StateListQuery(model_id="nope")).states == []
    assert [s.id for s in client.list_states(StateListQuery(model_id=MODEL, tier=Tier.DISK, limit=1)).states] == [
        state_id
    ]

    preview = client.state_action(state_id, StateActionRequest(action="pin", dry_run=True))
    assert preview.dry_run and preview.state.pinned
    assert not client.list_states().states[0].pinned
    done = client.state_action(state_id, StateActionRequest(action="pin", allow_experimental=True))
    assert not done.dry_run and done.changed and client.list_states().states[0].pinned
    with pytest.raises(UnsupportedError) as unsupported:
        client.state_action(state_id, StateActionRequest(action="promote", target_tier="ram", allow_experimental=True))
    assert unsupported.value.status == 501 and (unsupported.value.request_id or "").startswith("req_")
    with pytest.raises(NotFoundError):
        client.state_action("st_doesnotexist", StateActionRequest(action="unpin", dry_run=True))

    decoded = client.decode(DecodeRequest(handoff=handoff, max_tokens=2, allow_experimental=True))
    assert (decoded.text, decoded.completion_tokens, decoded.handoff) == ("one two", 2, None)
    with pytest.raises(ExpiredHandoffError):
        client.decode(DecodeRequest(handoff=handoff, max_tokens=2, allow_experimental=True))

    client.state_action(state_id, StateActionRequest(action="unpin", allow_experimental=True))
    ids = PruneRequest(selector=IdsSelector(kind="ids", ids=[state_id]))
    preview_prune = client.prune_states(ids)
    assert (preview_prune.matched, preview_prune.removed, preview_prune.dry_run) == (1, 0, True)
    by_filter = PruneRequest(selector=FilterSelector(kind="filter", model_id=MODEL), dry_run=True)
    assert client.prune_states(by_filter).matched == 1
    removed = client.prune_states(PruneRequest(selector=AllSelector(kind="all", confirm=True), dry_run=False))
    assert (removed.removed, removed.dry_run) == (1, False)
    assert client.list_states().states == []


def test_message_prefill_and_next_handoff(live_continuing: Live) -> None:
    client = WerkProtocolClient(live_continuing.url, LIVE_KEY)
    result = client.prefill(
        PrefillRequest(
            model_id=MODEL,
            input=MessagesInput(type="messages", messages=[Message(role="user", content="alpha beta gamma")]),
            policy=Policy(mode="ephemeral", reuse="disabled"),
            allow_experimental=True,
        )
    )
    assert result.state_id is None
    first = client.decode(
        DecodeRequest(
            handoff=result.handoff,
            max_tokens=1,
            temperature=0.5,
            top_p=0.9,
            seed=3,
            stop=["</x>"],
            allow_experimental=True,
        )
    )
    assert first.handoff is not None
    assert first.handoff.get_secret_value() != result.handoff.get_secret_value()
    assert "**" in repr(first)


def test_experimental_opt_in_is_enforced(live: Live) -> None:
    client = WerkProtocolClient(live.url, LIVE_KEY)
    request = PrefillRequest(model_id=MODEL, input=TextInput(type="text", text="x"), allow_experimental=False)
    with pytest.raises(ExperimentalOptInRequiredError) as caught:
        client.prefill(request)
    assert caught.value.status == 428


def test_chat_planning_routes(live: Live) -> None:
    client = WerkProtocolClient(live.url, LIVE_KEY)
    chat = ChatRequest(messages=[ChatMessage(role="user", content="hello there world")])
    count = client.count_tokens(chat)
    assert isinstance(count, TokenCount) and count.input_tokens > 0 and count.model == MODEL
    admission = client.admission(ChatRequest(model=MODEL, messages=chat.messages, max_tokens=8))
    assert isinstance(admission, Admission) and admission.max_output_tokens == 8
    assert isinstance(client.chat_limits(), ChatLimits)
    assert client.chat_limits(MODEL).model == MODEL
    with pytest.raises(NotFoundError):
        client.chat_limits("no-such-model")
    available: dict[int, set[str]] = {}
    for model, budget in ((None, 4096), (MODEL, 64)):
        profile = client.reasoning(model, max_output_tokens=budget)
        assert isinstance(profile, ReasoningProfile) and profile.supported and profile.model == MODEL
        assert profile.limits.output_tokens == budget
        available[budget] = {t.id.value for t in profile.tiers if t.available}
        assert all((t.reasoning_tokens or 0) < budget for t in profile.tiers if t.available)
    assert available[64] == {"none"} and {"none", "low", "medium", "high"} <= available[4096]


def test_reasoning_route_when_the_backend_has_no_profile(home: Path) -> None:
    statuses = {**EXPERIMENTAL_STATE, CapabilityId.REASONING: CapabilityStatus.UNSUPPORTED}
    host, _ = hosts.backend_host(home, api_keys=(LIVE_KEY,), adapter_kwargs={"statuses": statuses})
    with hosts.running(host) as url, pytest.raises(UnsupportedError) as err:
        WerkProtocolClient(url, LIVE_KEY).reasoning(MODEL, max_output_tokens=64)
    assert err.value.status == 501 and not err.value.retryable


def test_expert_routes(live: Live) -> None:
    client = WerkProtocolClient(live.url, LIVE_KEY)
    with pytest.raises(ExperimentalOptInRequiredError):
        client.list_experts()
    page = client.list_experts(ExpertListQuery(model_id=MODEL, limit=3, allow_experimental=True))
    assert isinstance(page, ExpertPage) and len(page.experts) == 3 and page.next_cursor is not None
    rest = client.list_experts(ExpertListQuery(model_id=MODEL, cursor=page.next_cursor, allow_experimental=True))
    assert {e.id for e in page.experts}.isdisjoint(e.id for e in rest.experts)
    external = next(e for e in page.experts + rest.experts if e.tier.value == "external")
    request = ExpertActionRequest(
        model_id=MODEL,
        expert_ids=[external.id],
        action="prefetch",
        target_tier="ram",
        dry_run=True,
        allow_experimental=True,
    )
    preview = client.expert_action(request)
    assert preview.dry_run and preview.experts[0].tier.value == "ram"
    listed = client.list_experts(ExpertListQuery(model_id=MODEL, tier="external", allow_experimental=True))
    assert external.id in {e.id for e in listed.experts}  # the dry run changed nothing
    done = client.expert_action(request.model_copy(update={"dry_run": False}))
    assert done.changed and not done.dry_run
    listed = client.list_experts(ExpertListQuery(model_id=MODEL, tier="ram", allow_experimental=True))
    assert external.id in {e.id for e in listed.experts}
    with pytest.raises(NotFoundError):
        client.expert_action(request.model_copy(update={"expert_ids": ["layer9.expert99"]}))


def test_authentication(live: Live) -> None:
    for client in (WerkProtocolClient(live.url, "sk-wrong-key"), WerkProtocolClient(live.url)):
        with pytest.raises(UnauthorizedError) as caught:
            client.info()
        assert caught.value.status == 401 and caught.value.request_id and not caught.value.retryable


def test_a_server_without_keys_needs_none(home: Path) -> None:
    host, _ = hosts.backend_host(home)
    with hosts.running(host) as url:
        assert WerkProtocolClient(url).info().active_backend


def test_client_logs_never_hold_secrets(live: Live, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    client = WerkProtocolClient(live.url, LIVE_KEY)
    handoff, _ = prefill(client)
    client.decode(DecodeRequest(handoff=handoff, allow_experimental=True))
    with pytest.raises(ExpiredHandoffError) as caught:
        client.decode(DecodeRequest(handoff=handoff, allow_experimental=True))
    assert any(r.name == "werk_host.client" for r in caplog.records)
    for text in (caplog.text, str(caught.value), repr(caught.value), repr(client)):
        assert LIVE_KEY not in text and handoff not in text
