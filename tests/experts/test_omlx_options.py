"""``werk.omlx`` chat options: validated by the API through the plugin that owns the adapter
(``werk_request_options``; the oMLX backend, which reports ``api.chat.omlx_options`` as
``supported``, owns ``werk.omlx``), ``invalid_request`` on every other backend and route."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from werk_host import hookimpl
from werk_host.protocol import CapabilityId, CapabilityStatus
from werk_host.seam import InferenceResponse, JsonObject
from werk_host.server import Host
from werk_host.testing.api import Api
from werk_host.testing.hosts import make_host, running
from werk_host.testing.reference import BACKEND_ID, EXPERIMENTAL_STATE, PLUGIN_NAME, MemoryAdapter, MemoryBackendPlugin

KEY = "sk-werk-omlx-options-0123"
MESSAGES = [{"role": "user", "content": "hello"}]
#: The oMLX plugin's own rule for ``werk.omlx``, which a backend reporting ``api.chat.omlx_options``
#: as ``supported`` applies here.
omlx_options = pytest.importorskip("werk_omlx.options", reason="the oMLX plugin is not installed")


class OmlxOptionsAdapter(MemoryAdapter):
    """The reference adapter owning ``werk.omlx`` as the oMLX plugin's does."""

    @hookimpl(specname="werk_request_options")
    def request_options(self, name: str, options: JsonObject) -> JsonObject | None:
        result: JsonObject | None = omlx_options.validated_options(name, options)
        return result


class OmlxOptionsPlugin(MemoryBackendPlugin):
    """The reference backend owning ``werk.omlx`` (:class:`OmlxOptionsAdapter`)."""

    adapter_class = OmlxOptionsAdapter


def serve(tmp_path: Path, omlx: CapabilityStatus | None) -> Host:
    statuses = dict(EXPERIMENTAL_STATE)
    if omlx is not None:
        statuses[CapabilityId.OMLX_OPTIONS] = omlx
    kind = OmlxOptionsPlugin if omlx is CapabilityStatus.SUPPORTED else MemoryBackendPlugin
    plugin = kind(statuses=statuses)
    return make_host(tmp_path / "home", plugin=plugin, plugin_name=PLUGIN_NAME, api_keys=(KEY,))


@pytest.mark.parametrize("omlx", [None, CapabilityStatus.UNSUPPORTED, CapabilityStatus.UNAVAILABLE])
def test_other_backends_refuse_werk_omlx_on_every_route(tmp_path: Path, omlx: CapabilityStatus | None) -> None:
    host = serve(tmp_path, omlx)
    with running(host) as url:
        api = Api(url, KEY)
        body = {"messages": MESSAGES, "max_tokens": 4, "werk": {"omlx": {"expert_cache_mb": 64}}}
        status, doc = api.post("/v1/chat/completions", body)
        assert status == 400, doc
        for path in ("/werk/v1/chat/count_tokens", "/werk/v1/chat/admission"):
            status, doc = api.post(path, body)
            assert status == 400 and doc["error"]["code"] == "invalid_request", (path, doc)
        assert doc["error"]["message"] == f"werk.omlx is not supported by backend {BACKEND_ID}", doc
        status, doc = api.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4})
        assert status == 200, doc  # the same request without werk.omlx is served


def test_where_supported_the_options_pass_validation(tmp_path: Path) -> None:
    host = serve(tmp_path, CapabilityStatus.SUPPORTED)
    with running(host) as url:
        api = Api(url, KEY)
        ok = {"thinking": False, "expert_cache_mb": 64, "ngram_cache_mb": "auto"}
        status, doc = api.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4, "werk": {"omlx": ok}})
        assert status == 200, doc
        for bad in ({"expert_cache_mb": 0}, {"expert_cache_mb": "64"}, {"ngram_cache_mb": "big"}, {"other": 1}):
            body = {"messages": MESSAGES, "max_tokens": 4, "werk": {"omlx": bad}}
            status, doc = api.post("/v1/chat/completions", body)
            assert status == 400, (bad, doc)
            field = next(iter(bad))
            assert doc["error"]["message"].startswith(f"werk.omlx.{field}: "), doc
            for path in ("/werk/v1/chat/count_tokens", "/werk/v1/chat/admission"):
                status, doc = api.post(path, body)
                assert status == 400 and doc["error"]["code"] == "invalid_request", (path, doc)


class RecordingAdapter(OmlxOptionsAdapter):
    """The adapter above, keeping every chat body it receives in its plugin's ``bodies``."""

    plugin: RecordingPlugin

    @hookimpl(specname="werk_chat_completion")
    def chat_completion(self, request: JsonObject) -> InferenceResponse:
        self.plugin.bodies.append(request)
        return super().chat_completion(request)


class RecordingPlugin(OmlxOptionsPlugin):
    """The reference backend, keeping every chat body its adapter received."""

    adapter_class = RecordingAdapter

    def __init__(self, statuses: Mapping[CapabilityId, CapabilityStatus]) -> None:
        super().__init__(statuses=statuses)
        self.bodies: list[JsonObject] = []


@pytest.mark.parametrize(
    ("profile_supported", "expect_reasoning"), [(True, True), (False, False)], ids=["tiers", "no-tiers"]
)
def test_werk_omlx_reaches_the_adapter_beside_a_reasoning_tier(
    tmp_path: Path, profile_supported: bool, expect_reasoning: bool
) -> None:
    plugin = RecordingPlugin(statuses={**EXPERIMENTAL_STATE, CapabilityId.OMLX_OPTIONS: CapabilityStatus.SUPPORTED})
    host = make_host(tmp_path / "home", plugin=plugin, plugin_name=PLUGIN_NAME, api_keys=(KEY,))
    with running(host) as url:
        if not profile_supported:  # a closed adapter answers an unsupported reasoning profile
            for adapter in plugin.adapters:
                adapter.closed = True
        options = {"thinking": False, "expert_cache_mb": 64}
        body = {"messages": MESSAGES, "max_tokens": 4, "werk": {"omlx": options, "reasoning": {"tier": "default"}}}
        status, doc = Api(url, KEY).post("/v1/chat/completions", body)
        assert status == 200, doc
    werk = plugin.bodies[-1]["werk"]
    assert isinstance(werk, dict) and werk["omlx"] == options
    assert ("reasoning" in werk) is expect_reasoning
