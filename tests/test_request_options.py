"""Backend members ``werk.<name>`` of a chat request: the plugin that owns the request's adapter
validates them (``werk_request_options``); the host checks only their shape, answers
``invalid_request`` for a member that plugin does not own, and passes the owner's validated
options on. Chat, token counting and admission fail alike (docs/plugin-hooks.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field

from werk_host import hookimpl
from werk_host.plugin.options import OptionInt, RequestOptions, validate_options
from werk_host.seam import InferenceResponse, JsonObject
from werk_host.testing.api import Api
from werk_host.testing.hosts import make_host, running
from werk_host.testing.markers import covers_hooks
from werk_host.testing.reference import BACKEND_ID, PLUGIN_NAME, MemoryAdapter, MemoryBackendPlugin

KEY = "sk-werk-request-options-0123"
MESSAGES = [{"role": "user", "content": "hello"}]
ROUTES = ("/v1/chat/completions", "/werk/v1/chat/count_tokens", "/werk/v1/chat/admission")


class EchoOptions(RequestOptions):
    level: Annotated[OptionInt, Field(ge=1, le=9)] | None = None


class EchoOptionsAdapter(MemoryAdapter):
    """The reference adapter owning ``werk.echo``, keeping every chat body it receives and every
    member it is asked about in its plugin's ``bodies`` and ``asked``."""

    plugin: EchoOptionsPlugin

    @hookimpl(specname="werk_request_options")
    def request_options(self, name: str, options: JsonObject) -> JsonObject | None:
        self.plugin.asked.append(name)
        if name != "echo":
            return None
        validated: JsonObject = validate_options(EchoOptions, name, options).model_dump(exclude_none=True)
        return validated

    @hookimpl(specname="werk_chat_completion")
    def chat_completion(self, request: JsonObject) -> InferenceResponse:
        self.plugin.bodies.append(request)
        return super().chat_completion(request)


class EchoOptionsPlugin(MemoryBackendPlugin):
    """The reference backend owning ``werk.echo``, keeping every chat body its adapter received."""

    adapter_class = EchoOptionsAdapter

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[JsonObject] = []
        self.asked: list[str] = []


def body(werk: JsonObject) -> JsonObject:
    return {"messages": MESSAGES, "max_tokens": 4, "werk": werk}


@covers_hooks("werk_request_options")
def test_the_owners_validated_options_reach_the_adapter(tmp_path: Path) -> None:
    plugin = EchoOptionsPlugin()
    host = make_host(tmp_path / "home", plugin=plugin, plugin_name=PLUGIN_NAME, api_keys=(KEY,))
    with running(host) as url:
        api = Api(url, KEY)
        for path in ROUTES:
            status, doc = api.post(path, body({"echo": {"level": 2.0}, "reasoning": {"tier": "default"}}))
            assert status == 200, (path, doc)
    assert plugin.bodies[-1]["werk"]["echo"] == {"level": 2}  # the owner's answer: 2.0 read as 2
    assert set(plugin.asked) == {"echo"}  # the host's own member (reasoning) is never asked about


def test_the_owners_refusal_and_members_nobody_owns_fail_on_every_route(tmp_path: Path) -> None:
    plugin = EchoOptionsPlugin()
    host = make_host(tmp_path / "home", plugin=plugin, plugin_name=PLUGIN_NAME, api_keys=(KEY,))
    with running(host) as url:
        api = Api(url, KEY)
        cases = [
            ({"echo": {"level": 10}}, "werk.echo.level: Input should be less than or equal to 9"),
            ({"echo": {"loud": True}}, "werk.echo.loud: Extra inputs are not permitted"),
            ({"other": {"x": 1}}, f"werk.other is not supported by backend {BACKEND_ID}"),
        ]
        for werk, message in cases:
            for path in ROUTES:
                status, doc = api.post(path, body(werk))
                assert status == 400 and doc["error"]["code"] == "invalid_request", (path, doc)
                assert doc["error"]["message"] == message, (path, doc)
        for werk in ({"echo": 1}, {"Echo": {}}, {"echo-1": {}}):  # not an object, not a member name
            for path in ROUTES:
                status, doc = api.post(path, body(werk))
                assert status == 400 and doc["error"]["code"] == "invalid_request", (path, werk, doc)
    assert plugin.bodies == []


def test_a_backend_without_the_hook_refuses_every_backend_member(tmp_path: Path) -> None:
    host = make_host(tmp_path / "home", plugin=MemoryBackendPlugin(), plugin_name=PLUGIN_NAME, api_keys=(KEY,))
    with running(host) as url:
        api = Api(url, KEY)
        for path in ROUTES:
            status, doc = api.post(path, body({"echo": {}}))
            assert status == 400, (path, doc)
            assert doc["error"]["message"] == f"werk.echo is not supported by backend {BACKEND_ID}", (path, doc)
            status, doc = api.post(path, body({"reasoning": {"tier": "default"}}))
            assert status == 200, (path, doc)
