"""The test model generator ships in ``werk_vllm.testing``, which nothing the plugin runs imports."""

from __future__ import annotations

import json
import subprocess
import sys

#: In a fresh interpreter: load the plugin's entry point as the host does, import every other
#: module of the package outside ``werk_vllm.testing``, and list what got imported.
_RUNTIME_IMPORTS = """
import importlib, importlib.metadata as md, importlib.util, json, pkgutil, sys
(ep,) = [ep for ep in md.entry_points(group="werk") if ep.name == "vllm"]
ep.load()
import werk_vllm
for info in pkgutil.iter_modules(werk_vllm.__path__, "werk_vllm."):
    if info.name != "werk_vllm.testing":
        importlib.import_module(info.name)
print(json.dumps({
    "modules": sorted(n for n in sys.modules if n.split(".")[0] == "werk_vllm"),
    "old_home": importlib.util.find_spec("werk_vllm.tinymodel") is not None,
}))
"""


def test_the_runtime_never_imports_the_test_model_generator() -> None:
    run = subprocess.run([sys.executable, "-c", _RUNTIME_IMPORTS], capture_output=True, text=True, check=True)
    found = json.loads(run.stdout)
    assert not found["old_home"]
    assert "werk_vllm.plugin" in found["modules"] and "werk_vllm.adapter" in found["modules"]
    assert [m for m in found["modules"] if m.startswith("werk_vllm.testing")] == []
