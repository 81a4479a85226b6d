"""The whole Werk conformance suite for this plugin: one fixture."""

from __future__ import annotations

import pytest
from werk_template import plugin
from werk_template.adapter import EchoAdapter

from werk_host.backend import Adapter
from werk_host.models import ModelManifest
from werk_host.testing.conformance import ConformanceTarget, WerkConformance


def reload(adapter: Adapter) -> None:
    assert isinstance(adapter, EchoAdapter)
    adapter.reload()


class TestConformance(WerkConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, tmp_path_factory: pytest.TempPathFactory) -> ConformanceTarget:
        weights = tmp_path_factory.mktemp("model") / "echo.txt"
        weights.write_text("an echo model has no weights\n")
        manifest = ModelManifest.from_paths("echo-model", [weights], backend="echo")
        return ConformanceTarget(plugin=plugin, plugin_name="template", model=manifest, replace_process=reload)
