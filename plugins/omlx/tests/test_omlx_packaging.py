"""The test model generator ships in ``werk_omlx.testing``, which nothing the plugin runs imports."""

from __future__ import annotations

import json
import subprocess
import sys

#: In a fresh interpreter: load the plugin's entry point as the host does, import every other
#: module of the package outside ``werk_omlx.testing``, and list what got imported.
_RUNTIME_IMPORTS = """
import importlib, importlib.metadata as md, importlib.util, json, pkgutil, sys
(ep,) = [ep for ep in md.entry_points(group="werk") if ep.name == "omlx"]
ep.load()
import werk_omlx
for info in pkgutil.iter_modules(werk_omlx.__path__, "werk_omlx."):
    if info.name != "werk_omlx.testing":
        importlib.import_module(info.name)
print(json.dumps({
    "modules": sorted(n for n in sys.modules if n.split(".")[0] == "werk_omlx"),
    "old_home": importlib.util.find_spec("werk_omlx.testmodel") is not None,
}))
"""


def test_the_runtime_never_imports_the_test_model_generator() -> None:
    run = subprocess.run([sys.executable, "-c", _RUNTIME_IMPORTS], capture_output=True, text=True, check=True)
    found = json.loads(run.stdout)
    assert not found["old_home"]
    assert "werk_omlx.plugin" in found["modules"] and "werk_omlx.adapter" in found["modules"]
    assert [m for m in found["modules"] if m.startswith("werk_omlx.testing")] == []
