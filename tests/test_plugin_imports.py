"""Plugins reach the host through one room: ``werk_host.plugin`` (and its submodules) in their
code, plus ``werk_host.testing`` in their tests (docs/plugin-kit.md, "The public room").

Every Python file under ``plugins/`` is parsed and every import of a ``werk_host`` module is
checked, module level or inside a function; ``from werk_host import X`` counts as importing
``werk_host.X`` when ``X`` is a submodule, and as importing the host's top level otherwise.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ROOT / "plugins"
#: The host modules a plugin may import (and everything below them).
ROOM = ("werk_host.plugin", "werk_host.testing")


def _allowed(module: str) -> bool:
    return any(module == room or module.startswith(room + ".") for room in ROOM)


def _host_imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` for every ``werk_host`` module the file imports."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "werk_host"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            if node.module.split(".")[0] != "werk_host":
                continue
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                is_module = importlib.util.find_spec(node.module) is not None and _is_module(sub)
                found.append((node.lineno, sub if is_module else node.module))
    return found


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _plugin_files() -> list[Path]:
    return sorted(p for p in PLUGINS.glob("*/**/*.py") if ".venv" not in p.parts and "build" not in p.parts)


def test_every_plugin_file_is_checked() -> None:
    files = _plugin_files()
    dirs = {p.relative_to(PLUGINS).parts[0] for p in files}
    assert {"llamacpp", "vllm", "omlx", "candle_bridge", "_template"} <= dirs
    assert any(p.parts[-2] == "tests" for p in files)


@pytest.mark.parametrize("plugin", sorted(d.name for d in PLUGINS.iterdir() if (d / "pyproject.toml").is_file()))
def test_a_plugin_imports_the_host_only_through_the_room(plugin: str) -> None:
    outside = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in _plugin_files()
        if path.relative_to(PLUGINS).parts[0] == plugin
        for line, module in _host_imports(path)
        if not _allowed(module)
    ]
    assert outside == [], "imports outside werk_host.plugin / werk_host.testing:\n" + "\n".join(outside)


def test_the_check_sees_imports_outside_the_room(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import werk_host.server\n"
        "from werk_host import hookimpl\n"
        "from werk_host import plugin\n"
        "from werk_host.plugin import hookimpl as h\n"
        "def f():\n"
        "    from werk_host.service.reasoning import unsupported_profile\n",
        encoding="utf-8",
    )
    modules = [m for _, m in _host_imports(planted)]
    assert [m for m in modules if not _allowed(m)] == ["werk_host.server", "werk_host", "werk_host.service.reasoning"]
    assert "werk_host.plugin" in modules
