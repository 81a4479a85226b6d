"""``werk.omlx`` chat options: validated by the API, accepted only where ``api.chat.omlx_options`` is
``supported`` (the oMLX backend), ``invalid_request`` on every other backend and route."""

from __future__ import annotations

from pathlib import Path

import pytest

from werk_host.protocol import CapabilityId, CapabilityStatus
from werk_host.server import Host
from werk_host.testing.api import Api
from werk_host.testing.hosts import make_host, running
from werk_host.testing.reference import EXPERIMENTAL_STATE, PLUGIN_NAME, MemoryBackendPlugin

KEY = "sk-werk-omlx-options-0123"
MESSAGES = [{"role": "user", "content": "hello"}]


def serve(tmp_path: Path, omlx: CapabilityStatus | None) -> Host:
    statuses = dict(EXPERIMENTAL_STATE)
    if omlx is not None:
        statuses[CapabilityId.OMLX_OPTIONS] = omlx
    plugin = MemoryBackendPlugin(statuses=statuses)
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
