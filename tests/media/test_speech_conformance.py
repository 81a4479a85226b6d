"""The speech conformance suite (werk_host/testing/speech_conformance.py) over the reference
speech backend: the kit's suite passes against the smallest speech adapter, as a plugin's would."""

from __future__ import annotations

import pytest

from werk_host.models import ModelManifest
from werk_host.testing.conformance_target import ConformanceTarget
from werk_host.testing.markers import covers_hooks
from werk_host.testing.speech import SPEECH_BACKEND, ReferenceSpeechPlugin
from werk_host.testing.speech_conformance import SpeechConformance


@covers_hooks("werk_speech_limits", "werk_speech_synthesis", "werk_capabilities")
class TestReferenceSpeechConformance(SpeechConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, tmp_path_factory: pytest.TempPathFactory) -> ConformanceTarget:
        weights = tmp_path_factory.mktemp("refspeech") / "voice.bin"
        weights.write_bytes(b"reference speech weights")
        manifest = ModelManifest.from_paths("voice", [weights], backend=SPEECH_BACKEND)
        return ConformanceTarget(plugin=ReferenceSpeechPlugin(), plugin_name=SPEECH_BACKEND, model=manifest)
