"""Ownership is derived from the registration: a plugin whose names disagree is ``failed``.

The owner of a factory is the plugin (entry point) whose ``werk_adapter_factories`` returned
it; a factory's explicit ``plugin_name`` or an adapter's ``plugin_name`` attribute only asserts
that name, and a mismatch takes the plugin out (docs/plugin-hooks.md, "Ownership"). The plugins
here are planted distributions, found through their entry points as a user's install is.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from werk_host import hookspecs
from werk_host.config import HostConfig
from werk_host.errors import WerkError
from werk_host.hooks import BackendHooks
from werk_host.pluginhost import PluginHost
from werk_host.protocol import TextInput
from werk_host.seam import PrefillWork

pytest_plugins = ["pytester"]

PLANTED = """
from werk_host import hookimpl
from werk_host.seam import AdapterFactory

CALLS = []


class Adapter:
    instance_id = "{name}:m"
    backend = "{name}"
    {attribute}

    def identity(self):
        return self.instance_id

    def close(self):
        pass

    @hookimpl(specname="werk_prefill")
    def prefill(self, work):
        CALLS.append("prefill")
        raise AssertionError("a failed plugin answered an operation")


@hookimpl
def werk_adapter_factories(config):
    return [AdapterFactory("{name}", lambda m: True, lambda c, m: Adapter(){keyword})]
"""

#: entry-point name -> (the adapter's class attribute, the factory's extra keyword)
DISTRIBUTIONS = {
    "misnamed": ("", ', plugin_name="othername"'),
    "mislabelled": ('plugin_name = "llamacpp"', ""),
    "named": ('plugin_name = "named"', ', plugin_name="named"'),
    "oldstyle": ("", ""),
}
#: more module source by entry-point name: a backend module still answering an operation
#: itself (the hook API 0.2 form), and a wrapper-only plugin
EXTRA = {
    "oldstyle": """

@hookimpl
def werk_prefill(adapter, work):
    CALLS.append("module prefill")
""",
    "audit": """
from werk_host import hookimpl

SEEN = []


@hookimpl(wrapper=True)
def werk_prefill(adapter, work):
    SEEN.append(adapter.backend)
    return (yield)
""",
}


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    site = tmp_path / "site"
    site.mkdir()
    for name in {*DISTRIBUTIONS, *EXTRA}:
        module = f"werk_planted_{name}"
        attribute, keyword = DISTRIBUTIONS.get(name, ("", ""))
        source = PLANTED.format(name=name, attribute=attribute, keyword=keyword) if name in DISTRIBUTIONS else ""
        source += EXTRA.get(name, "")
        (site / f"{module}.py").write_text(textwrap.dedent(source))
        info = site / f"{module}-1.0.0.dist-info"
        info.mkdir()
        meta = ["Metadata-Version: 2.1", f"Name: werk-planted-{name}", "Version: 1.0.0"]
        meta.append(f"Requires-Dist: werk-host>={hookspecs.HOOK_API_VERSION}")
        (info / "METADATA").write_text("\n".join(meta) + "\n")
        (info / "entry_points.txt").write_text(f"[werk]\n{name} = {module}\n")
    monkeypatch.syspath_prepend(str(site))
    yield site
    for name in {*DISTRIBUTIONS, *EXTRA}:
        sys.modules.pop(f"werk_planted_{name}", None)


def _records(host: PluginHost) -> dict[str, dict[str, object]]:
    return {str(r["name"]): r for r in host.inventory()}


def test_werk_plugins_lists_a_factory_naming_another_plugin_as_failed(
    planted: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from werk_host.cli import main

    monkeypatch.setenv("WERK_HOME", str(tmp_path / "home"))
    assert main(["plugins", "--json"]) == 0
    listed = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    misnamed = listed["misnamed"]
    assert misnamed["status"] == "failed" and misnamed["hooks"] == []
    assert "plugin_name 'othername'" in misnamed["error"] and "installed as 'misnamed'" in misnamed["error"]
    assert listed["named"]["status"] == "loaded"  # a name that agrees only asserts it
    assert listed["mislabelled"]["status"] == "loaded"  # its adapter is checked when one is created
    assert main(["plugins"]) == 0
    text = capsys.readouterr().out
    assert "misnamed failed: its factory for backend misnamed says plugin_name 'othername'" in text
    assert "drop plugin_name" in text


def test_a_plugin_whose_names_disagree_never_answers_an_operation(planted: Path, tmp_path: Path) -> None:
    host = PluginHost()
    host.load_entry_points(environ={})
    config = HostConfig(home=tmp_path)
    factories = {f.backend: f for f in host.adapter_factories(config)}
    assert "misnamed" not in factories and host.pm.get_plugin("misnamed") is None
    assert factories["named"].owner == "named"
    work = PrefillWork("m", TextInput(type="text", text="a b"), want_snapshot=False)
    adapter = factories["mislabelled"].create(config, None)
    with pytest.raises(WerkError) as refused:
        host.attach(adapter, factories["mislabelled"])
    assert "plugin mislabelled failed" in refused.value.message
    record = _records(host)["mislabelled"]
    assert record["status"] == "failed"
    assert "adapter for backend mislabelled says plugin_name 'llamacpp'" in str(record["error"])
    with pytest.raises(WerkError):
        BackendHooks(host).prefill(adapter, work)
    offered = {f.backend for f in host.adapter_factories(config)}
    assert "named" in offered and not offered & {"misnamed", "mislabelled"}
    assert sys.modules["werk_planted_mislabelled"].CALLS == []
    with pytest.raises(WerkError):  # a later adapter of the failed plugin is refused too
        host.attach(factories["mislabelled"].create(config, None), factories["mislabelled"])


def test_a_backend_module_still_answering_an_operation_itself_is_failed(planted: Path, tmp_path: Path) -> None:
    host = PluginHost()
    host.load_entry_points(environ={})
    records = _records(host)
    oldstyle = records["oldstyle"]
    assert oldstyle["status"] == "failed" and "(werk_prefill), the hook API 0.2 form" in str(oldstyle["error"])
    assert records["audit"]["status"] == "loaded"  # a wrapper-only plugin implements operation hooks
    config = HostConfig(home=tmp_path)
    factories = {f.backend: f for f in host.adapter_factories(config)}
    assert "oldstyle" not in factories
    adapter = factories["named"].create(config, None)
    host.attach(adapter, factories["named"])
    with pytest.raises(AssertionError, match="a failed plugin answered"):  # the planted adapter's own method
        BackendHooks(host).prefill(adapter, PrefillWork("m", TextInput(type="text", text="a"), want_snapshot=False))
    assert sys.modules["werk_planted_audit"].SEEN == ["named"]  # the installed wrapper wrapped it
    assert sys.modules["werk_planted_oldstyle"].CALLS == []


SUITE = """
import pytest
from werk_host.testing.conformance import ConformanceTarget, WerkConformance


class TestPlanted(WerkConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, tmp_path_factory):
        weights = tmp_path_factory.mktemp("m") / "w.bin"
        weights.write_bytes(b"w")
        return ConformanceTarget(entry_point="{name}", model=weights)
"""


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("misnamed", "its factory for backend misnamed says plugin_name 'othername'"),
        ("mislabelled", "its adapter for backend mislabelled says plugin_name 'llamacpp'"),
    ],
)
def test_the_conformance_suite_loads_the_plugin_through_its_entry_point_and_fails_a_misnamed_one(
    planted: Path, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, name: str, reason: str
) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(planted), *sys.path]))
    pytester.makepyfile(test_planted=SUITE.format(name=name))
    result = pytester.runpytest_subprocess("-q", "-x", "-p", "no:cacheprovider")
    assert result.ret != 0
    result.stdout.fnmatch_lines([f"*{reason}*"])
