"""Loading the installed plugins imports no backend's adapter (docs/operations.md, "Start-up").

``werk serve`` and ``werk run`` load every installed plugin to choose a model's backend; a
backend's adapter module (and the optional engine dependencies it brings, such as candle's
template engine) is imported only when an instance of that backend is created, and a
plugin's doctor module only when its checks run. Checked in a fresh interpreter: load the
entry points, collect the adapter factories and choose the backend of an unpinned GGUF file,
as a start does, then list what was imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import json, sys
from pathlib import Path

from werk_host.config import HostConfig
from werk_host.deployments.registry import choose_factory
from werk_host.models import ModelManifest
from werk_host.pluginhost import PluginHost

host = PluginHost()
host.load_entry_points()
factories = host.adapter_factories(HostConfig(home=Path(sys.argv[1])))
chosen = choose_factory(factories, ModelManifest.from_paths("m", [Path(sys.argv[2])]), None)
loaded = sorted(r.name for r in host.records if r.status == "loaded")
print(json.dumps({"chosen": chosen and chosen.backend, "loaded": loaded, "modules": sorted(sys.modules)}))
"""

#: Backend plugins whose adapter must wait for an instance of theirs: plugin -> modules.
DEFERRED = {
    "vllm": ("werk_vllm.adapter", "werk_vllm.doctor"),
    "candle": ("werk_candle_bridge.adapter", "werk_candle_bridge.doctor", "minijinja"),
    "omlx": ("werk_omlx.adapter", "werk_omlx.doctor"),
}


def test_loading_the_plugins_imports_no_adapter_of_an_unused_backend(tmp_path: Path) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "home"), str(gguf)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["chosen"] == "llama.cpp"
    present = [name for name in DEFERRED if name in found["loaded"]]
    if not present:
        pytest.skip("none of the vllm, candle and omlx plugins is installed")
    imported = set(found["modules"])
    for name in present:
        early = [module for module in DEFERRED[name] if module in imported]
        assert not early, f"loading the {name} plugin imported {early}"
