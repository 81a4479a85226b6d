"""Base-URL validation, constructor checks and secret hygiene of the client object."""

from __future__ import annotations

import pickle

import pytest

from werk_host.client import (
    ClientConfigError,
    InvalidBaseUrlError,
    WerkProtocolClient,
    parse_base_url,
)
from werk_host.protocol import StateActionRequest

KEY = "sk-werk-config-91c2d7e4"


@pytest.mark.parametrize(
    ("url", "normalized"),
    [
        ("http://127.0.0.1:11434", "http://127.0.0.1:11434"),
        ("http://127.0.0.1:11434/", "http://127.0.0.1:11434"),
        ("HTTP://LocalHost:8080", "http://localhost:8080"),
        ("http://[::1]:9000", "http://[::1]:9000"),
        ("http://[0:0:0:0:0:0:0:1]:9000/", "http://[::1]:9000"),
        ("http://werk-host.internal:1", "http://werk-host.internal:1"),
        ("http://10.0.0.7:65535", "http://10.0.0.7:65535"),
    ],
)
def test_accepted_base_urls(url: str, normalized: str) -> None:
    assert parse_base_url(url).url == normalized
    assert WerkProtocolClient(url).base_url == normalized


@pytest.mark.parametrize(
    "url",
    [
        "",
        "https://127.0.0.1:443",
        "ftp://127.0.0.1:21",
        "127.0.0.1:11434",
        "//127.0.0.1:11434",
        "http://127.0.0.1",
        "http://127.0.0.1/",
        "http://127.0.0.1:",
        "http://127.0.0.1:0",
        "http://127.0.0.1:65536",
        "http://127.0.0.1:123456",
        "http://127.0.0.1:+80",
        "http://127.0.0.1:-1",
        "http://127.0.0.1:8o",
        "http://127.0.0.1:80/werk",
        "http://127.0.0.1:80/werk/v1/",
        "http://127.0.0.1:80//",
        "http://127.0.0.1:80?x=1",
        "http://127.0.0.1:80/?x=1",
        "http://127.0.0.1:80#frag",
        "http://user@127.0.0.1:80",
        "http://user:pw@127.0.0.1:80",
        "http://:80",
        "http://[::1]",
        "http://[::1]80",
        "http://[::1:80",
        "http://::1:80",
        "http://[fe80::1%25eth0]:80",
        "http://[not-v6]:80",
        "http://256.1.1.1:80",
        "http://1.2.3:80",
        "http://exa_mple:80",
        "http://-bad.example:80",
        "http://bad-.example:80",
        "http://a..b:80",
        "http://" + "a" * 64 + ":80",
        " http://127.0.0.1:80",
        "http://127.0.0.1:80 ",
        "http://127.0.0.1:8\n0",
        "http://127.0.0.1:80\r\nX-Evil: 1",
        "http://127.0.0.1:\uff18\uff10",
        "http://b\u00fccher.example:80",
        "http:\\\\127.0.0.1:80",
        "http://127.0.0.1:80\\",
        "http://" + "a." * 1100 + "b:80",
    ],
)
def test_rejected_base_urls(url: str) -> None:
    with pytest.raises(InvalidBaseUrlError):
        WerkProtocolClient(url)


@pytest.mark.parametrize("url", [None, 11434, b"http://127.0.0.1:80"])
def test_non_string_base_urls(url: object) -> None:
    with pytest.raises(InvalidBaseUrlError):
        parse_base_url(url)


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), True, "30"])
def test_invalid_timeouts(timeout: object) -> None:
    with pytest.raises(ClientConfigError):
        WerkProtocolClient("http://127.0.0.1:1", timeout=timeout)  # type: ignore[arg-type]


def test_default_and_custom_timeout() -> None:
    assert WerkProtocolClient("http://127.0.0.1:1").timeout == 30.0
    assert WerkProtocolClient("http://127.0.0.1:1", timeout=2).timeout == 2.0


@pytest.mark.parametrize("key", ["", "sk werk", "sk-werk\r\nX-Evil: 1", "sk-\u00e9", "k" * 4097])
def test_invalid_keys_are_rejected_without_being_echoed(key: str) -> None:
    with pytest.raises(ClientConfigError) as caught:
        WerkProtocolClient("http://127.0.0.1:1", key)
    if key:
        assert key not in str(caught.value) and key not in repr(caught.value)


def test_repr_and_str_never_contain_the_key() -> None:
    client = WerkProtocolClient("http://127.0.0.1:11434", KEY)
    for text in (repr(client), str(client), f"{client}", f"{client!r}", repr(vars(client))):
        assert KEY not in text
    assert "<set>" in repr(client)
    assert client.has_api_key
    assert "None" in repr(WerkProtocolClient("http://127.0.0.1:11434"))


def test_the_client_refuses_pickling() -> None:
    with pytest.raises(TypeError):
        pickle.dumps(WerkProtocolClient("http://127.0.0.1:11434", KEY))


@pytest.mark.parametrize("state_id", ["", ".", "..", "../info", "a/b", "st_x?y=1", "st_x#y", "st x", "st_\u00e9"])
def test_unsafe_state_ids_are_refused_before_any_io(state_id: str) -> None:
    # port 1 is never served here; a ClientConfigError (not a TransportError) proves nothing was sent
    client = WerkProtocolClient("http://127.0.0.1:1", KEY)
    with pytest.raises(ClientConfigError):
        client.state_action(state_id, StateActionRequest(action="pin", dry_run=True))


@pytest.mark.parametrize("value", [0, -3, True])
def test_reasoning_output_budget_must_be_positive(value: int) -> None:
    with pytest.raises(ClientConfigError):
        WerkProtocolClient("http://127.0.0.1:1").reasoning(max_output_tokens=value)


@pytest.mark.parametrize("deployment", ["", "a b", "x\r\ny"])
def test_invalid_deployment_ids(deployment: str) -> None:
    with pytest.raises(ClientConfigError):
        WerkProtocolClient("http://127.0.0.1:1", deployment=deployment)


def test_unencodable_requests_are_refused_before_any_io() -> None:
    from werk_host.protocol import ChatMessage, ChatRequest

    request = ChatRequest(messages=[ChatMessage(role="user", content="lone \ud800 surrogate")])
    with pytest.raises(ClientConfigError):
        WerkProtocolClient("http://127.0.0.1:1").count_tokens(request)
