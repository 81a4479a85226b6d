"""The whole Werk conformance suite for this plugin: one fixture."""

from __future__ import annotations

import pytest
from werk_template import plugin
from werk_template.adapter import BACKEND_ID, TemplateAdapter

from werk_host.plugin import Adapter, ModelManifest
from werk_host.testing.conformance import ConformanceTarget, WerkConformance


def reload(adapter: Adapter) -> None:
    assert isinstance(adapter, TemplateAdapter)
    adapter.reload()


class TestConformance(WerkConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, tmp_path_factory: pytest.TempPathFactory) -> ConformanceTarget:
        # COPIERS: a real (small) model of your backend, and how to replace its process.
        weights = tmp_path_factory.mktemp("model") / "template.txt"
        weights.write_text("the template model has no weights\n")
        manifest = ModelManifest.from_paths("template-model", [weights], backend=BACKEND_ID)
        # The suite loads the plugin through the entry point naming this module, as a user's
        # install does (or, not installed, the one pyproject.toml declares).
        return ConformanceTarget(plugin=plugin, model=manifest, replace_process=reload)
