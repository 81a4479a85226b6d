"""The conformance suite every speech plugin runs against the real HTTP app, with one fixture
(docs/plugin-kit.md, "Testing"; docs/media.md, "Writing a speech backend")::

    import pytest
    from werk_host.testing.conformance import ConformanceTarget
    from werk_host.testing.speech_conformance import SpeechConformance

    class TestSpeechConformance(SpeechConformance):
        @pytest.fixture(scope="class")
        @classmethod
        def conformance_target(cls) -> ConformanceTarget:
            return ConformanceTarget(entry_point="mine", model=Path("my-voice-model"))

The host is the one the text suite starts (:func:`~werk_host.testing.conformance_target.served_target`:
the plugin loaded through its entry point, alone, one API key). ``SHORT`` and ``LONG``
(class attributes) are the sentences it speaks. The suite checks, over HTTP:

* the capability ids the plugin declares and reports are :class:`CapabilityId` s,
  ``media.speech.synthesis`` among them and ``supported`` once a synthesis has run (evidence);
* ``werk_speech_limits``: ``wav`` and the default format among the formats, the default voice
  among the voices, a sample rate;
* ``POST /v1/audio/speech`` answers a WAV of the limits' sample rate, with samples; a longer
  input gives longer audio; the same seed gives the same bytes, another seed others;
* every listed format runs, with its content type;
* a ``kind: speech`` job succeeds and its result file is the synchronous route's audio, byte for
  byte;
* an unknown voice or format, an over-long input, a ``speed`` the model lacks: a 400 before any
  work; no error message carries a path or the key.
"""

from __future__ import annotations

import io
import json
import re
import time
import urllib.error
import urllib.request
import wave
from collections.abc import Iterator
from typing import Any, ClassVar, cast

import pytest

from werk_host import hookspecs
from werk_host.protocol import CapabilityId, CapabilityStatus
from werk_host.protocol.speech import AUDIO_CONTENT_TYPES, MAX_SPEECH_CHARS, SpeechLimits
from werk_host.testing.conformance_target import ConformanceHost, ConformanceTarget, served_target

__all__ = ["SpeechConformance", "wav_info"]

_PATH = re.compile(r"(?<![\w.])/(?:[\w.-]+/)+[\w.-]+")
_SPEECH_IDS = (CapabilityId.SPEECH_SYNTHESIS, CapabilityId.SPEECH_INSTRUCTIONS, CapabilityId.SPEECH_STREAMING)


def wav_info(data: bytes) -> tuple[int, int]:
    """``(sample rate, frames)`` of a WAV file, asserting it is a mono 16-bit one."""
    with wave.open(io.BytesIO(data)) as reader:
        assert reader.getnchannels() == 1, "speech is mono"
        assert reader.getsampwidth() == 2, "a 16-bit WAV"
        return reader.getframerate(), reader.getnframes()


class SpeechConformance:
    """Subclass in a speech plugin's tests with a class-scoped ``conformance_target`` fixture."""

    SHORT: ClassVar[str] = "Hello world."
    LONG: ClassVar[str] = "Hello world. This sentence is a good deal longer than the first one, on purpose."

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_host(
        cls, conformance_target: ConformanceTarget, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[ConformanceHost]:
        with served_target(conformance_target, tmp_path_factory.mktemp("werk-speech-conformance") / "home") as host:
            yield host

    # -- helpers ----------------------------------------------------------------------------
    def _post(self, host: ConformanceHost, body: dict[str, Any]) -> tuple[int, bytes, str]:
        """``POST /v1/audio/speech``: ``(status, body, content type)``; error messages are kept
        for the leak check."""
        request = urllib.request.Request(
            host.api.base + "/v1/audio/speech",
            data=json.dumps({"model": host.model_name, **body}).encode(),
            headers={"Authorization": f"Bearer {host.key}", "Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=300) as answer:
                return answer.status, answer.read(), answer.headers.get("Content-Type", "")
        except urllib.error.HTTPError as err:
            data = err.read()
            host.errors.append(str(json.loads(data).get("error", {}).get("message", "")))
            return err.code, data, err.headers.get("Content-Type", "")

    def _speech(self, host: ConformanceHost, **fields: Any) -> bytes:
        status, data, _type = self._post(host, {"response_format": "wav", **fields})
        assert status == 200, data[:500]
        return data

    def _limits(self, host: ConformanceHost) -> SpeechLimits:
        self._speech(host, input="limits", seed=1)  # the instance is started
        limits = host.host.fleet.hooks.speech_limits(host.adapter)
        assert isinstance(limits, SpeechLimits), f"{hookspecs.werk_speech_limits.__name__} must answer SpeechLimits"
        return limits

    def _call(self, host: ConformanceHost, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
        status, doc = host.call(method, path, body)
        return status, cast(dict[str, Any], doc)

    # -- ids and limits ------------------------------------------------------------------------
    def test_speech_ids_are_declared_reported_and_evidenced(self, conformance_host: ConformanceHost) -> None:
        host = conformance_host
        self._speech(host, input="evidence", seed=1)  # the instance is started and has run
        plugins = host.host.plugins
        raw = plugins.dispatch(hookspecs.werk_capabilities.__name__, host.adapter) or {}
        assert isinstance(raw, dict), "werk_capabilities must return a mapping"
        unknown = sorted(str(k) for k in raw if k not in set(CapabilityId))
        assert not unknown, f"unknown capability ids reported: {unknown}"
        declared = {
            CapabilityId(c)
            for f in plugins.adapter_factories(host.host.config)
            if f.owner == plugins.owner_of(host.adapter)
            for c in f.capabilities
        }
        assert CapabilityId.SPEECH_SYNTHESIS in declared, "a speech plugin declares media.speech.synthesis"
        assert not set(raw) - declared, "reported but not declared on the AdapterFactory"
        assert host.statuses()[CapabilityId.SPEECH_SYNTHESIS] is CapabilityStatus.SUPPORTED

    def test_speech_limits_are_coherent(self, conformance_host: ConformanceHost) -> None:
        limits = self._limits(conformance_host)
        assert "wav" in limits.formats and limits.default_format in limits.formats
        assert set(limits.formats) <= set(AUDIO_CONTENT_TYPES)
        assert limits.default_voice in limits.voices if limits.voices else limits.default_voice is None
        assert limits.sample_rate is not None and limits.sample_rate > 0

    # -- synthesis ----------------------------------------------------------------------------
    def test_speech_is_a_wav_that_grows_with_its_input_and_keeps_the_seed_contract(
        self, conformance_host: ConformanceHost
    ) -> None:
        host = conformance_host
        limits = self._limits(host)
        short = self._speech(host, input=self.SHORT, seed=41)
        rate, frames = wav_info(short)
        assert rate == limits.sample_rate and frames > 0
        assert self._speech(host, input=self.SHORT, seed=41) == short
        assert self._speech(host, input=self.SHORT, seed=42) != short
        assert wav_info(self._speech(host, input=self.LONG, seed=41))[1] > frames

    def test_every_listed_format_runs_with_its_content_type(self, conformance_host: ConformanceHost) -> None:
        host = conformance_host
        for fmt in self._limits(host).formats:
            status, data, content_type = self._post(host, {"input": self.SHORT, "seed": 5, "response_format": fmt})
            assert status == 200 and data, (fmt, data[:300])
            assert content_type == AUDIO_CONTENT_TYPES[fmt], fmt

    def test_a_speech_job_s_result_is_the_synchronous_audio(self, conformance_host: ConformanceHost) -> None:
        host = conformance_host
        fields = {"input": self.SHORT, "seed": 9, "response_format": "wav"}
        status, doc = self._call(
            host, "POST", "/werk/v1/jobs", {"kind": "speech", "model": host.model_name, "input": fields}
        )
        assert status == 202, doc
        job_id = doc["data"]["id"]
        deadline = time.monotonic() + 300
        while (view := self._call(host, "GET", f"/werk/v1/jobs/{job_id}")[1]["data"])["status"] in (
            "queued",
            "running",
        ):
            assert time.monotonic() < deadline, f"the job did not finish: {view}"
            time.sleep(0.02)
        assert view["status"] == "succeeded", view
        assert [f["name"] for f in view["results"]] == ["speech.wav"]
        request = urllib.request.Request(
            f"{host.api.base}/werk/v1/jobs/{job_id}/result/speech.wav", headers={"Authorization": f"Bearer {host.key}"}
        )
        with urllib.request.urlopen(request, timeout=60) as answer:
            assert answer.read() == self._speech(host, input=self.SHORT, seed=9)

    def test_bad_input_is_refused_before_any_work_and_says_nothing_private(
        self, conformance_host: ConformanceHost
    ) -> None:
        host = conformance_host
        limits = self._limits(host)
        bad: list[dict[str, Any]] = [
            {"input": ""},
            {"input": "x" * (MAX_SPEECH_CHARS + 1)},
            {"input": "x", "response_format": "no-such-format"},
        ]
        if limits.voices:
            bad.append({"input": "x", "voice": "no-such-voice"})
        if not limits.speed:
            bad.append({"input": "x", "speed": 2.0})
        for body in bad:
            status, data, _type = self._post(host, body)
            assert status == 400, (body, data[:300])
        for message in host.errors:
            assert not _PATH.search(message), f"an error message carries a path: {message!r}"
            assert host.key not in message
            for path in host.model_paths:
                assert path not in message
