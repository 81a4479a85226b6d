"""The media conformance suite (werk_host/testing/media_conformance.py) over the reference media
backend: the kit's suite passes against the smallest media adapter, as a plugin's would."""

from __future__ import annotations

import pytest

from werk_host.models import ModelManifest
from werk_host.testing.conformance_target import ConformanceTarget
from werk_host.testing.markers import covers_hooks
from werk_host.testing.media import MEDIA_BACKEND, ReferenceMediaPlugin
from werk_host.testing.media_conformance import MediaConformance


@covers_hooks("werk_image_limits", "werk_image_generation", "werk_capabilities")
class TestReferenceMediaConformance(MediaConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, tmp_path_factory: pytest.TempPathFactory) -> ConformanceTarget:
        weights = tmp_path_factory.mktemp("refmedia") / "pix.bin"
        weights.write_bytes(b"reference media weights")
        manifest = ModelManifest.from_paths("pix", [weights], backend=MEDIA_BACKEND, params={"step_delay_s": 0.01})
        return ConformanceTarget(plugin=ReferenceMediaPlugin(), plugin_name=MEDIA_BACKEND, model=manifest)
