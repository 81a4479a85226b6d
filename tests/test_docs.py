"""Docs that restate a fact of the code stay in step with it."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from werk_host import capdocs
from werk_host.plugins import OPERATION_HOOKS, hook_names
from werk_host.protocol import CAPABILITY_OPERATIONS, CapabilityId
from werk_host.testing import pytest_plugin
from werk_host.testing.conformance import HOOKS_BEHIND

ROOT = Path(__file__).resolve().parents[1]


def test_protocol_doc_lists_every_capability_id_with_its_operations() -> None:
    text = (ROOT / "docs" / "protocol.md").read_text()
    rows = re.findall(r"^\| `([a-z_.]+)` \| `([A-Z_]+)` \| (.*) \|$", text, flags=re.M)
    documented = {cap: (member, tuple(re.findall(r"`(\w+)`", ops))) for cap, member, ops in rows}
    expected = {c.value: (c.name, CAPABILITY_OPERATIONS[c]) for c in CapabilityId}
    assert documented == expected


def test_docs_links_resolve() -> None:
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)#:]+\.md)", doc.read_text()):
            assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"


# -- docs/plugin-kit.md: what a third party builds a backend from ---------------------------

KIT = ROOT / "docs" / "plugin-kit.md"
_BACKTICKED = re.compile(r"`([^`\n]+)`")


def _resolve(dotted: str) -> object:
    """The module or attribute ``dotted`` names (``werk_host.plugin.openai.Reply``)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(dotted)


def test_plugin_kit_capability_table_is_generated_from_the_code() -> None:
    text = KIT.read_text(encoding="utf-8")
    assert capdocs.render(text) == text, "stale: run python -m werk_host.capdocs docs/plugin-kit.md"


def test_capability_hooks_cover_every_id_with_operation_hooks() -> None:
    assert set(capdocs.CAPABILITY_HOOKS) == set(CapabilityId)
    for cap_id, backing in capdocs.CAPABILITY_HOOKS.items():
        assert set(backing.needs) | set(backing.uses) <= OPERATION_HOOKS, cap_id
        assert not set(backing.needs) & set(backing.uses), cap_id


def test_capability_hooks_include_every_hook_the_conformance_suite_requires() -> None:
    for cap_id, hooks in HOOKS_BEHIND.items():
        assert set(hooks) <= set(capdocs.CAPABILITY_HOOKS[cap_id].needs), cap_id


def test_capdocs_refuses_a_guide_without_markers() -> None:
    with pytest.raises(ValueError, match="markers"):
        capdocs.render("# a guide with no generated section\n")


def test_capdocs_main_rewrites_a_stale_table(tmp_path: Path) -> None:
    guide = tmp_path / "kit.md"
    guide.write_text(f"intro\n{capdocs.BEGIN}\n| stale |\n{capdocs.END}\noutro\n", encoding="utf-8")
    assert capdocs.main([str(guide)]) == 0
    assert (
        guide.read_text(encoding="utf-8")
        == f"intro\n{capdocs.BEGIN}\n{capdocs.capability_table()}{capdocs.END}\noutro\n"
    )


def test_plugin_kit_names_in_the_host_exist() -> None:
    """Every ``werk_host....`` name the kit mentions resolves, and so does every name listed in
    a row of its room table (``| `werk_host.plugin.x` | ... `Name` ... |``) in that module."""
    text = KIT.read_text(encoding="utf-8")
    dotted = {m for m in _BACKTICKED.findall(text) if re.fullmatch(r"werk_host(\.\w+)+", m)}
    assert {"werk_host.plugin", "werk_host.testing", "werk_host.testing.host"} <= dotted
    for name in sorted(dotted):
        _resolve(name)
    rows = re.findall(r"^\| `(werk_host(?:\.\w+)+)` \| (.*) \|$", text, flags=re.M)
    assert len(rows) >= 8
    for module, cell in rows:
        for name in _BACKTICKED.findall(cell):
            if re.fullmatch(r"[A-Za-z_]\w*", name):
                assert hasattr(_resolve(module), name), f"{module} has no {name}"


def test_plugin_kit_hooks_and_fixtures_exist() -> None:
    """Every ``werk_*`` identifier in backticks or ``specname=`` is a hook of the hookspecs or a
    fixture of the test kit (the room table's names are checked above)."""
    text = re.sub(r"^\| `werk_host.*$", "", KIT.read_text(encoding="utf-8"), flags=re.M)
    names = set(re.findall(r"specname=\"(\w+)\"", text))
    names |= {m for m in _BACKTICKED.findall(text) if re.fullmatch(r"werk_[a-z_]+", m) and m != "werk_host"}
    assert {"werk_capabilities", "werk_chat_completion", "werk_count_tokens"} <= names
    for name in sorted(names):
        assert name in hook_names() or hasattr(pytest_plugin, name), name


def test_plugin_kit_files_exist() -> None:
    """Every repository file the kit names in backticks exists (plugin sources by package path)."""
    text = KIT.read_text(encoding="utf-8")
    bases = [ROOT, *ROOT.glob("plugins/*"), *ROOT.glob("plugins/*/src")]
    for path in {m for m in _BACKTICKED.findall(text) if re.fullmatch(r"[\w./-]+\.py", m) and "/" in m}:
        assert any((base / path).is_file() for base in bases), path
