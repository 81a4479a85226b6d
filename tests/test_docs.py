"""Docs that restate a fact of the code stay in step with it."""

from __future__ import annotations

import importlib
import json
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from werk_host import capdocs, hookspecs
from werk_host.config import HostConfig
from werk_host.models import ModelManifest
from werk_host.pluginhost import OPERATION_HOOKS, hook_names
from werk_host.protocol import CAPABILITY_OPERATIONS, CapabilityId, CapabilityStatus
from werk_host.testing import pytest_plugin
from werk_host.testing.api import Api
from werk_host.testing.conformance import HOOKS_BEHIND, ConformanceTarget, WerkConformance
from werk_host.testing.host import PluginHost, werk_main
from werk_host.testing.hosts import backend_host, running

ROOT = Path(__file__).resolve().parents[1]


def test_protocol_doc_lists_every_capability_id_with_its_operations() -> None:
    text = (ROOT / "docs" / "protocol.md").read_text()
    rows = re.findall(r"^\| `([a-z0-9_.]+)` \| `([A-Z0-9_]+)` \| (.*) \|$", text, flags=re.M)
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
    names |= {
        m for m in _BACKTICKED.findall(text) if re.fullmatch(r"werk_[a-z_]+", m) and m not in ("werk_host", "werk_echo")
    }
    assert {"werk_capabilities", "werk_chat_completion", "werk_count_tokens"} <= names
    for name in sorted(names):
        assert name in hook_names() or hasattr(pytest_plugin, name), name


def test_plugin_kit_files_exist() -> None:
    """Every repository file the kit names in backticks exists (plugin sources by package path)."""
    text = KIT.read_text(encoding="utf-8")
    bases = [ROOT, *ROOT.glob("plugins/*"), *ROOT.glob("plugins/*/src")]
    for path in {m for m in _BACKTICKED.findall(text) if re.fullmatch(r"[\w./-]+\.py", m) and "/" in m}:
        assert any((base / path).is_file() for base in bases), path


def test_plugin_kit_sections_cited_elsewhere_exist() -> None:
    """Every ``docs/plugin-kit.md, "Section"`` citation in the host, the plugins and the docs
    names a heading of the kit (its number aside)."""
    headings = {
        re.sub(r"^\d+\.\s*", "", h) for h in re.findall(r"^#{2,4} (.+)$", KIT.read_text(encoding="utf-8"), re.M)
    }
    sources = [*ROOT.glob("werk_host/**/*.py"), *ROOT.glob("plugins/*/src/**/*.py"), *ROOT.glob("docs/*.md")]
    cited: set[tuple[str, str]] = set()
    for path in sources:
        for section in re.findall(r"plugin-kit\.md,\s+\"([^\"]+)\"", path.read_text(encoding="utf-8")):
            cited.add((path.relative_to(ROOT).as_posix(), re.sub(r"\s*\n\s*#?\s*", " ", section)))
    assert cited
    assert sorted(c for c in cited if c[1] not in headings) == []


def test_plugin_kit_anchors_linked_elsewhere_exist() -> None:
    """Every ``plugin-kit.md#anchor`` link in the docs and the README is a heading's anchor."""
    titles = re.findall(r"^#{1,4} (.+)$", KIT.read_text(encoding="utf-8"), re.M)
    anchors = {re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", t.lower()).strip()) for t in titles}
    linked = {
        (path.name, anchor)
        for path in [ROOT / "README.md", *ROOT.glob("docs/*.md")]
        for anchor in re.findall(r"plugin-kit\.md#([\w-]+)", path.read_text(encoding="utf-8"))
    }
    assert linked
    assert sorted(a for a in linked if a[1] not in anchors) == []


def test_capability_table_says_who_reports_each_status(tmp_path: Path) -> None:
    """A backend reporting every id: the listing carries its report exactly for the ids the
    table marks as the plugin's (placement too, since it reports that), the host's for the rest."""
    everything = dict.fromkeys(CapabilityId, CapabilityStatus.SUPPORTED)
    host, _ = backend_host(tmp_path, api_keys=("k" * 32,), adapter_kwargs={"statuses": everything})
    with running(host) as base:
        api = Api(base, "k" * 32)
        assert (
            api.call("POST", "/werk/v1/chat/count_tokens", {"messages": [{"role": "user", "content": "hi"}]})[0] == 200
        )
        status, doc = api.call("GET", "/werk/v1/capabilities")
    assert status == 200, doc
    listing = doc["data"]
    assert isinstance(listing, list)
    from_plugin = {
        str(c["id"]) for c in listing if isinstance(c, dict) and str(c["detail"]).startswith("reference adapter")
    }
    assert from_plugin == {c.value for c, backing in capdocs.CAPABILITY_HOOKS.items() if not backing.host}


# -- the kit's echo backend, as a third party would write it from the page -------------------

#: The chat method's block is written into the adapter's class where this line stands.
CHAT_PLACEHOLDER = '    # werk_chat_completion: "Chat hooks" below\n'


def kit_files() -> dict[str, str]:
    """The files of the kit's running example: each ```python block whose first line is
    ``# <path>``, with the chat method block put into the adapter."""
    blocks = re.findall(r"^```python\n(.*?)^```$", KIT.read_text(encoding="utf-8"), flags=re.M | re.S)
    files = {m.group(1): block for block in blocks if (m := re.match(r"# ((?:src|tests)/[\w/]+\.py)\b", block))}
    chat = [b for b in blocks if b.lstrip().startswith('@hookimpl(specname="werk_chat_completion")')]
    assert len(chat) == 1 and CHAT_PLACEHOLDER in files["src/werk_echo/adapter.py"]
    files["src/werk_echo/adapter.py"] = files["src/werk_echo/adapter.py"].replace(CHAT_PLACEHOLDER, chat[0])
    return files


def kit_entry_points() -> str:
    """The page's ``pyproject.toml`` entry points, as ``entry_points.txt`` of an installed wheel."""
    toml = re.findall(r"^```toml\n(.*?)^```$", KIT.read_text(encoding="utf-8"), flags=re.M | re.S)
    project = tomllib.loads(next(t for t in toml if "[project]" in t))["project"]
    groups = project["entry-points"]
    assert set(groups) == {"werk", "werk.cli"}
    return "".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) for g, eps in groups.items())


def kit_requirement() -> str:
    found = re.findall(r'dependencies = \["(werk-host[^"]*)"\]', KIT.read_text(encoding="utf-8"))
    assert len(found) == 1
    return str(found[0])


def test_plugin_kit_requirement_is_the_hook_api_of_this_host() -> None:
    major, minor = (int(p) for p in hookspecs.HOOK_API_VERSION.split("."))
    assert kit_requirement() == f"werk-host>={major}.{minor},<{major}.{minor + 1}"
    assert f"Hook API {hookspecs.HOOK_API_VERSION}." in KIT.read_text(encoding="utf-8")


@pytest.fixture(scope="class")
def kit_echo_installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The kit's ``werk-echo`` installed the way pip leaves it: its package and a dist-info with
    the page's requirement and entry point on ``sys.path``."""
    site = tmp_path_factory.mktemp("site")
    for name, source in kit_files().items():
        if name.startswith("src/"):
            path = site / name.removeprefix("src/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(source, encoding="utf-8")
    (site / "werk_echo" / "__init__.py").write_text('"""werk-echo: the kit\'s example backend."""\n')
    info = site / "werk_echo-0.1.0.dist-info"
    info.mkdir()
    meta = ["Metadata-Version: 2.1", "Name: werk-echo", "Version: 0.1.0", f"Requires-Dist: {kit_requirement()}"]
    (info / "METADATA").write_text("\n".join(meta) + "\n")
    (info / "entry_points.txt").write_text(kit_entry_points())
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    try:
        yield site
    finally:
        sys.path.remove(str(site))
        for module in [m for m in sys.modules if m == "werk_echo" or m.startswith("werk_echo.")]:
            del sys.modules[module]


@pytest.mark.usefixtures("kit_echo_installed")
class TestKitEchoInstalled:
    """What ``werk`` itself makes of the page's werk-echo: it loads, and its command runs."""

    def test_werk_plugins_lists_it_loaded(self, tmp_path: Path) -> None:
        plugins = PluginHost()
        plugins.load_entry_points(environ={})
        record = next(r for r in plugins.inventory() if r["name"] == "echo")
        assert (record["status"], record["distribution"], record["error"]) == ("loaded", "werk-echo", None)
        factories = [f for f in plugins.adapter_factories(HostConfig(home=tmp_path)) if f.backend == "echo"]
        assert [f.owner for f in factories] == ["echo"]

    def test_its_werk_command_runs(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert werk_main(["echo", "fetch", "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == {"engine": "echo", "fetched": False}


@pytest.mark.usefixtures("kit_echo_installed")
class TestKitEchoConformance(WerkConformance):
    """The page's echo backend passes the whole conformance suite, loaded through its entry point."""

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(
        cls, kit_echo_installed: Path, tmp_path_factory: pytest.TempPathFactory
    ) -> ConformanceTarget:
        test_module = kit_files()["tests/test_conformance.py"]
        assert 'ConformanceTarget(entry_point="echo", model=manifest, replace_process=reload)' in test_module
        namespace: dict[str, object] = {}
        exec(compile(test_module, "tests/test_conformance.py", "exec"), namespace)  # the page's reload()
        weights = tmp_path_factory.mktemp("model") / "echo.txt"
        weights.write_text("an echo model has no weights\n")
        manifest = ModelManifest.from_paths("echo-model", [weights], backend="echo")
        replace = namespace["reload"]
        assert callable(replace)
        return ConformanceTarget(entry_point="echo", model=manifest, replace_process=replace)
