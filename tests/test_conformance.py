"""The conformance suite itself: it passes for the reference plugin under every status profile,
and it fails for plugins that misreport (a misspelled id, a claim the backend does not keep,
an error message that leaks a path)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from werk_host.models import ModelManifest
from werk_host.protocol import CapabilityId, CapabilityStatus
from werk_host.seam import Adapter
from werk_host.testing.conformance import ConformanceHost, ConformanceTarget, WerkConformance
from werk_host.testing.reference import BACKEND_ID, EXPERIMENTAL_STATE, MemoryAdapter, MemoryBackendPlugin

pytest_plugins = ["pytester"]


def restart(adapter: Adapter) -> None:
    assert isinstance(adapter, MemoryAdapter)
    adapter.restart()


def target(tmp: pytest.TempPathFactory, statuses: dict[CapabilityId, CapabilityStatus]) -> ConformanceTarget:
    weights = tmp.mktemp("model") / "weights.bin"
    weights.write_bytes(b"reference weights")
    manifest = ModelManifest.from_paths("tiny", [weights], backend=BACKEND_ID)
    return ConformanceTarget(
        plugin=MemoryBackendPlugin(statuses=statuses),
        plugin_name="testbackend",
        model=manifest,
        replace_process=restart,
    )


#: Everything the reference backend can really do (it has no vram tier and its states die with
#: its process generation: claiming either fails the suite).
EVERYTHING_SUPPORTED: dict[CapabilityId, CapabilityStatus] = {
    cap_id: CapabilityStatus.SUPPORTED
    for cap_id in CapabilityId
    if "memory" not in cap_id and cap_id not in (CapabilityId.TIER_VRAM, CapabilityId.CROSS_RESTART)
}
NOTHING_AVAILABLE: dict[CapabilityId, CapabilityStatus] = {
    cap_id: CapabilityStatus.UNAVAILABLE for cap_id in EXPERIMENTAL_STATE if cap_id is not CapabilityId.MODEL_RESIDENCY
}


class TestReferenceExperimental(WerkConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, tmp_path_factory: pytest.TempPathFactory) -> ConformanceTarget:
        return target(tmp_path_factory, dict(EXPERIMENTAL_STATE))


class TestReferenceSupported(WerkConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, tmp_path_factory: pytest.TempPathFactory) -> ConformanceTarget:
        return target(tmp_path_factory, EVERYTHING_SUPPORTED)


class TestReferenceCheckpointDirectory(WerkConformance):
    """``model`` may be a checkpoint directory: it is registered as a manifest of its files."""

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, tmp_path_factory: pytest.TempPathFactory) -> ConformanceTarget:
        checkpoint = tmp_path_factory.mktemp("checkpoint")
        (checkpoint / "config.json").write_text('{"architectures": ["TinyForCausalLM"]}')
        (checkpoint / "model.safetensors").write_bytes(b"reference weights")
        return ConformanceTarget(plugin=MemoryBackendPlugin(), plugin_name="testbackend", model=checkpoint)

    def test_the_directory_is_the_manifest(self, conformance_host: ConformanceHost) -> None:
        names = {Path(p).name for p in conformance_host.model_paths}
        assert names == {"config.json", "model.safetensors"}


class TestReferenceUnavailable(WerkConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, tmp_path_factory: pytest.TempPathFactory) -> ConformanceTarget:
        return target(tmp_path_factory, NOTHING_AVAILABLE)


# -- the suite catches plugins that misreport --------------------------------------------------
SUITE = """
import pytest
from werk_host import hookimpl
from werk_host.seam import CapabilityReport
from werk_host.errors import ErrorCode, WerkError
from werk_host.models import ModelManifest
from werk_host.protocol import CapabilityId, CapabilityStatus
from werk_host.testing.conformance import ConformanceTarget, WerkConformance
from werk_host.testing.reference import BACKEND_ID, EXPERIMENTAL_STATE, MemoryAdapter, MemoryBackendPlugin


class Defective(MemoryBackendPlugin):
{body}


class TestDefective(WerkConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, tmp_path_factory):
        weights = tmp_path_factory.mktemp("m") / "w.bin"
        weights.write_bytes(b"w")
        manifest = ModelManifest.from_paths("tiny", [weights], backend=BACKEND_ID)
        return ConformanceTarget(plugin=Defective(), plugin_name="testbackend", model=manifest)
"""


def run_suite(pytester: pytest.Pytester, body: str) -> set[str]:
    """Run the suite against ``Defective`` (the reference plugin with ``body`` added); the
    names of the failed tests."""
    pytester.makepyfile(test_defective=SUITE.format(body=textwrap.indent(textwrap.dedent(body), "    ")))
    result = pytester.runpytest_subprocess("-q", "-rf", "-p", "no:cacheprovider")
    result.stdout.no_fnmatch_line("*ERROR*")  # failures, not a broken suite
    assert result.parseoutcomes().get("passed", 0) > 10  # the rest of the suite still ran
    return {line.split("::")[-1].split(" ")[0].split("[")[0] for line in result.outlines if line.startswith("FAILED")}


def test_a_misspelled_capability_id_fails_the_suite(pytester: pytest.Pytester) -> None:
    failed = run_suite(
        pytester,
        """
        class adapter_class(MemoryAdapter):
            @hookimpl(specname="werk_capabilities")
            def capabilities(self):
                reports = {k: CapabilityReport(v, "ok") for k, v in EXPERIMENTAL_STATE.items()}
                reports["runtime.state.presistence"] = CapabilityReport(CapabilityStatus.SUPPORTED, "typo")
                return reports
        """,
    )
    assert failed == {"test_declared_and_reported_ids_are_capability_ids"}


def test_a_claim_the_backend_does_not_keep_fails_the_suite(pytester: pytest.Pytester) -> None:
    # Reports prefill supported, but the hook answers "not implemented".
    failed = run_suite(
        pytester,
        """
        class adapter_class(MemoryAdapter):
            @hookimpl(specname="werk_capabilities")
            def capabilities(self):
                reports = {k: CapabilityReport(v, "ok") for k, v in EXPERIMENTAL_STATE.items()}
                reports[CapabilityId.PD_PREFILL] = CapabilityReport(CapabilityStatus.SUPPORTED, "claimed")
                reports[CapabilityId.PD_HANDOFF] = CapabilityReport(CapabilityStatus.SUPPORTED, "claimed")
                return reports

            @hookimpl(specname="werk_prefill")
            def prefill(self, work):
                return None
        """,
    )
    assert {"test_prefill_follows_status", "test_disk_prefill_follows_status"} <= failed


def test_a_token_count_that_disagrees_with_usage_fails_the_suite(pytester: pytest.Pytester) -> None:
    failed = run_suite(
        pytester,
        """
        class adapter_class(MemoryAdapter):
            @hookimpl(specname="werk_count_tokens")
            def count_tokens(self, request):
                return 1
        """,
    )
    assert failed == {"test_count_tokens_equals_v1_usage"}


def test_a_leaking_error_message_fails_the_suite(pytester: pytest.Pytester) -> None:
    failed = run_suite(
        pytester,
        """
        class adapter_class(MemoryAdapter):
            @hookimpl(specname="werk_count_tokens")
            def count_tokens(self, request):
                if sum(len(str(m.content).split()) for m in request.messages) > 10_000:
                    raise WerkError(ErrorCode.INVALID_REQUEST, "template failed in /srv/models/secret/template.jinja")
                return super().count_tokens(request)
        """,
    )
    assert failed == {"test_errors_leak_nothing"}
