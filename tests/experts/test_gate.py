"""The expert routes' capability gate, over HTTP with the reference backend: ``externally_managed``
permits the read-only list and nothing else; every other status behaves as for any operation."""

from __future__ import annotations

from pathlib import Path

import pytest

from werk_host.models import ModelManifest
from werk_host.protocol import CapabilityId, CapabilityStatus
from werk_host.testing.api import Api
from werk_host.testing.conformance import ConformanceTarget, WerkConformance
from werk_host.testing.hosts import make_host, running
from werk_host.testing.reference import BACKEND_ID, EXPERIMENTAL_STATE, PLUGIN_NAME, MemoryBackendPlugin

KEY = "sk-werk-experts-gate-0123"
ACTION = {"model_id": "tiny", "expert_ids": ["layer0.expert1"], "action": "pin", "dry_run": True}


def statuses_of(api: Api) -> dict[str, str]:
    status, doc = api.get("/werk/v1/capabilities")
    assert status == 200, doc
    return {c["id"]: c["status"] for c in doc["data"]}


@pytest.mark.parametrize(
    ("status", "list_plain", "list_opted", "act_opted"),
    [
        (CapabilityStatus.EXTERNALLY_MANAGED, 200, 200, 501),
        (CapabilityStatus.EXPERIMENTAL, 428, 200, 200),
        (CapabilityStatus.SUPPORTED, 200, 200, 200),
        (CapabilityStatus.UNSUPPORTED, 501, 501, 501),
        (CapabilityStatus.METADATA_ONLY, 501, 501, 501),
        (CapabilityStatus.UNAVAILABLE, 503, 503, 503),
    ],
)
def test_expert_routes_follow_the_reported_status(
    tmp_path: Path, status: CapabilityStatus, list_plain: int, list_opted: int, act_opted: int
) -> None:
    plugin = MemoryBackendPlugin(statuses={CapabilityId.EXPERTS: status})
    host = make_host(tmp_path / "home", plugin=plugin, plugin_name=PLUGIN_NAME, api_keys=(KEY,))
    with running(host) as url:
        api = Api(url, KEY)
        assert statuses_of(api)[CapabilityId.EXPERTS.value] == status.value
        got, doc = api.get("/werk/v1/experts")
        assert got == list_plain, doc
        if got == 200:
            assert {e["id"] for e in doc["data"]["experts"]} >= {"layer0.expert0", "layer0.expert1"}
        got, doc = api.get("/werk/v1/experts", allow_experimental="true")
        assert got == list_opted, doc
        got, doc = api.post("/werk/v1/experts/actions", {**ACTION, "allow_experimental": True})
        assert got == act_opted, doc
        if status is CapabilityStatus.EXTERNALLY_MANAGED:  # read-only: no action, not even a dry run
            assert doc["error"]["code"] == "unsupported"


class TestConformanceWithExternallyManagedExperts(WerkConformance):
    """The plugin kit's suite accepts a backend whose expert telemetry is read-only."""

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, tmp_path_factory: pytest.TempPathFactory) -> ConformanceTarget:
        weights = tmp_path_factory.mktemp("model") / "weights.bin"
        weights.write_bytes(b"reference weights")
        statuses = {**EXPERIMENTAL_STATE, CapabilityId.EXPERTS: CapabilityStatus.EXTERNALLY_MANAGED}
        return ConformanceTarget(
            plugin=MemoryBackendPlugin(statuses=statuses),
            plugin_name=PLUGIN_NAME,
            model=ModelManifest.from_paths("tiny", [weights], backend=BACKEND_ID),
        )
