"""Residency is the operator's (docs/deployments.md, "Residency"), over the reference backend on
a real waitress server: a key that is not an operator's can neither unload nor pin a shared
instance (so another key's handoffs stay live), its ``keep_alive`` is clamped into the profile's
``[keep_alive, keep_alive_max]``, and it never replaces an operator's setting; operator keys load,
unload and pin as Ollama does; with no key at all the local user is the operator. Durations are
bounded (one year) wherever they are given, so ``/api/ps`` always answers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from werk_host.cli.commands import build_parser
from werk_host.deployments.durations import MAX_DURATION_S
from werk_host.deployments.instances import Instance, InstanceView
from werk_host.deployments.profile import ProfileError, parse_profile
from werk_host.protocol.deployments import InstanceStateName
from werk_host.server import Host
from werk_host.testing.api import Api
from werk_host.testing.hosts import backend_host, running

KEY_A = "sk-werk-residency-a-0123456789"
KEY_B = "sk-werk-residency-b-0123456789"
OPERATOR = "sk-werk-residency-op-0123456789"
#: The profile keeps an idle instance for a minute; clients may ask for up to ten.
PROFILE = '[[instance]]\nid = "tiny"\nmodel = "tiny"\npreload = true\nkeep_alive = "1m"\nkeep_alive_max = "10m"\n'
SHORT = {"num_predict": 4}
MESSAGES = [{"role": "user", "content": "name three colours"}]


def _serve(tmp_path: Path, profile: str = PROFILE, **keys: Any) -> Iterator[tuple[Host, str]]:
    home = tmp_path / "home"
    home.mkdir()
    path = tmp_path / "deployments.toml"
    path.write_text(profile)
    host, _ = backend_host(home, profile=path, **keys)
    with running(host) as url:
        yield host, url


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Host, str]]:
    """Two client keys (A, B) and an operator key."""
    yield from _serve(tmp_path, api_keys=(KEY_A, KEY_B), operator_api_keys=(OPERATOR,))


def _instance(host: Host) -> Instance:
    assert host.fleet.deployments is not None
    return host.fleet.deployments.instances["tiny"]


def _ok(result: tuple[int, Any]) -> Any:
    status, body = result
    assert status == 200, body
    return body


def _handoff(api: Api) -> str:
    body = {"model_id": "tiny", "input": {"type": "text", "text": "a shared prefix"}, "allow_experimental": True}
    handoff: str = _ok(api.post("/werk/v1/prefill", {**body, "policy": {"mode": "ephemeral"}}))["data"]["handoff"]
    return handoff


def _decode(api: Api, handoff: str) -> tuple[int, Any]:
    return api.post("/werk/v1/decode", {"handoff": handoff, "max_tokens": 2, "allow_experimental": True})


def _chat(api: Api, keep_alive: object) -> None:
    body = {"model": "tiny", "messages": MESSAGES, "options": SHORT, "stream": False, "keep_alive": keep_alive}
    _ok(api.post("/api/chat", body))


def _keep_alive_s(api: Api) -> float | None:
    value: float | None = _ok(api.get("/werk/v1/deployments"))["data"]["inventory"][0]["keep_alive_seconds"]
    return value


# -- item 4: the cross-key unload, with two keys ------------------------------------------------------


def test_a_client_key_cannot_unload_the_instance_under_another_keys_handoff(served: tuple[Host, str]) -> None:
    host, url = served
    a, b = Api(url, KEY_A), Api(url, KEY_B)
    adapter = _instance(host).peek()
    handoff = _handoff(a)
    _chat(b, 0)  # B's generation with keep_alive 0 is served; the shared instance stays
    b.post("/api/generate", {"model": "tiny", "prompt": "hi", "keep_alive": "0", "stream": False, "options": SHORT})
    assert _decode(a, handoff)[0] == 200  # A's handoff is live: not 410
    handoff = _handoff(a)
    status, body = b.post("/api/generate", {"model": "tiny", "keep_alive": 0})  # Ollama's unload idiom
    assert status == 403 and set(body) == {"error"} and "operator" in body["error"], body
    instance = _instance(host)
    assert instance.view().state == "ready" and instance.peek() is adapter
    assert _keep_alive_s(a) == 60.0  # B's 0 stops it no sooner than the profile's minute
    _ok(_decode(a, handoff))


def test_a_client_key_cannot_pin_and_stays_within_the_profiles_bounds(served: tuple[Host, str]) -> None:
    _, url = served
    b = Api(url, KEY_B)
    _chat(b, -1)  # forever: clamped to keep_alive_max
    assert _keep_alive_s(b) == 600.0
    _ok(b.post("/api/generate", {"model": "tiny", "keep_alive": -1}))  # the load idiom: the same clamp
    assert _keep_alive_s(b) == 600.0
    _chat(b, "5m")  # within the bounds: as asked
    assert _keep_alive_s(b) == 300.0
    _chat(b, "1s")  # shorter than the profile's: the profile's
    assert _keep_alive_s(b) == 60.0


def test_operator_keys_load_unload_and_pin_and_clients_do_not_undo_it(served: tuple[Host, str]) -> None:
    host, url = served
    operator, b = Api(url, OPERATOR), Api(url, KEY_B)
    _chat(operator, -1)
    assert _keep_alive_s(operator) is None  # pinned: never stopped for idleness
    _chat(b, "5m")
    _chat(b, None)  # no keep_alive: would return a client's setting to the profile's
    assert _keep_alive_s(b) is None  # a client's request never replaces an operator's setting
    body = _ok(operator.post("/api/generate", {"model": "tiny", "keep_alive": 0}))
    assert body["done_reason"] == "unload" and _instance(host).view().state == "cold"
    body = _ok(operator.post("/api/chat", {"model": "tiny", "keep_alive": "2h"}))  # beyond keep_alive_max
    assert body["done_reason"] == "load" and _keep_alive_s(operator) == 7200.0


def test_without_keys_the_local_user_is_the_operator(tmp_path: Path) -> None:
    for host, url in _serve(tmp_path):
        local = Api(url)
        body = _ok(local.post("/api/generate", {"model": "tiny", "keep_alive": 0}))
        assert body["done_reason"] == "unload" and _instance(host).view().state == "cold"


# -- item 5: durations are bounded -------------------------------------------------------------------


@pytest.mark.parametrize("keep_alive", ["100000000h", 1e15, 1e20, 2**64, 1e300, "8761h", MAX_DURATION_S + 1])
def test_a_keep_alive_beyond_a_year_is_400_and_ps_keeps_answering(served: tuple[Host, str], keep_alive: object) -> None:
    _, url = served
    operator = Api(url, OPERATOR)
    for path, body in (
        ("/api/generate", {"model": "tiny", "keep_alive": keep_alive}),
        ("/api/chat", {"model": "tiny", "messages": MESSAGES, "options": SHORT, "keep_alive": keep_alive}),
    ):
        status, answer = operator.post(path, body)
        assert status == 400 and set(answer) == {"error"} and "keep_alive" in answer["error"], answer
    status, ps = operator.get("/api/ps")
    assert status == 200 and ps["models"][0]["expires_at"] is not None, ps
    _chat(operator, "8760h")  # a year is the longest finite hold
    assert _keep_alive_s(operator) == MAX_DURATION_S
    assert _ok(operator.get("/api/ps"))["models"][0]["expires_at"] is not None


def test_an_instance_refuses_a_hold_beyond_the_bound(served: tuple[Host, str]) -> None:
    host, _ = served
    with pytest.raises(ValueError, match="MAX_DURATION_S"):
        _instance(host).hold(1e300)


def _profile(text: str) -> None:
    parse_profile(text, source="deployments.toml", known_model=lambda name: name == "tiny")


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ('keep_alive = "100000000h"', 'instance[0].keep_alive: "100000000h" is longer than'),
        ('keep_alive = "8761h"', "8760h"),
        ("keep_alive = 100000000000000", "instance[0].keep_alive: "),
        ('keep_alive_max = "100000000h"', "instance[0].keep_alive_max: "),
        ('keep_alive = "1h"\nkeep_alive_max = "30m"', "keep_alive_max: is shorter than keep_alive"),
        ('keep_alive_max = "1h"', "keep_alive_max: is shorter than keep_alive"),  # keep_alive is forever
    ],
)
def test_profile_durations_are_bounded(line: str, fragment: str) -> None:
    with pytest.raises(ProfileError, match="deployments.toml:") as err:
        _profile(f'[[instance]]\nid = "a"\nmodel = "tiny"\n{line}\n')
    assert fragment in str(err.value)


def test_profile_bounds_parse() -> None:
    text = '[[instance]]\nid = "a"\nmodel = "tiny"\nkeep_alive = "8760h"\nkeep_alive_max = "forever"\n'
    spec = parse_profile(text, source="p", known_model=lambda name: True).instances[0]
    assert spec.keep_alive_s == MAX_DURATION_S and spec.keep_alive_max_s == float("inf")
    assert spec.client_hold(float("inf")) == float("inf") and spec.client_hold(0) is None


def test_an_expiry_no_timestamp_can_hold_is_reported_as_never() -> None:
    view = InstanceView("tiny", "reference", "tiny", InstanceStateName.READY, 0, 1, 1, None, 1e300)
    assert view.expires_unix_ms is None  # /api/ps says null, never a 500


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--channel-timeout", "100000000000"],
        ["serve", "--cleanup-interval", "31536001"],
        ["serve", "--request-read-timeout", "100000000000"],
        ["serve", "--backend-timeout", "1e300"],
        ["serve", "--backend-idle-timeout", "31536001"],
        ["serve", "--inference-wait", "inf"],
        ["serve", "--inference-wait", "nan"],
        ["runtime", "info", "--timeout", "1e20"],
    ],
)
def test_command_line_durations_are_bounded_too(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    assert exit_.value.code == 2 and "31536000" in capsys.readouterr().err


def test_command_line_durations_up_to_a_year_pass() -> None:
    args = build_parser().parse_args(["serve", "--channel-timeout", "31536000", "--backend-timeout", "31536000"])
    assert args.channel_timeout == 31536000 and args.backend_timeout == MAX_DURATION_S
