"""Without the engine (a platform with no mistralrs wheel) the plugin still loads and reports the
backend ``unavailable`` with the reason. Here the import is made to fail for real (the module is
hidden from the import system), so this runs on every platform."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from werk_candle_bridge import engine, plugin
from werk_candle_bridge.adapter import REPORTED_CAPABILITIES

from werk_host.plugin import ModelManifest
from werk_host.testing.pytest_plugin import WerkServerFactory


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setitem(sys.modules, engine.DISTRIBUTION, None)
    engine._module.cache_clear()
    reason = engine.missing_engine_reason()
    assert reason is not None
    yield reason
    engine._module.cache_clear()


def test_the_plugin_loads_and_reports_the_reason(
    no_engine: str, tiny_gguf: Path, werk_server: WerkServerFactory
) -> None:
    assert "not installed" in no_engine and "wheels for" in no_engine
    live = werk_server(plugin, model=ModelManifest.from_paths("tiny", [tiny_gguf], backend="candle"))
    record = next(r for r in live.host.plugins.records if r.name == "candle")
    assert record.status == "loaded" and not record.problems
    status, doc = live.api.get("/werk/v1/capabilities")
    assert status == 200
    reported = {c["id"]: c for c in doc["data"] if c["id"] in {str(i) for i in REPORTED_CAPABILITIES}}
    assert len(reported) == len(REPORTED_CAPABILITIES)
    assert all(c["status"] == "unavailable" and c["detail"] == no_engine for c in reported.values())
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    status, doc = live.api.post("/v1/chat/completions", body)
    assert status == 503 and doc["error"]["code"] == "unavailable", doc
    assert "not installed" in doc["error"]["message"]
    status, doc = live.api.post("/werk/v1/chat/count_tokens", body)
    assert status == 503, doc
