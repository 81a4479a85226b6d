"""The plugin framework: discovery, tolerant loading, dispatch, wrappers, docs and tests per hook."""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import falcon.testing
import pytest

from tests.conftest import KEY
from tests.support import covers_hooks
from tests.support.hosts import make_host
from tests.support.testadapter import BACKEND_ID, MemoryAdapter, MemoryBackendPlugin
from werk_host import hookimpl
from werk_host.backend import DecodeOptions, DecodeWork, PrefillWork
from werk_host.errors import WerkError
from werk_host.hookspecs import OPERATION_HOOKS
from werk_host.plugins import PluginHost, hook_names
from werk_host.protocol import ChatRequest, TextInput

ROOT = Path(__file__).resolve().parents[1]


def test_every_hook_is_documented() -> None:
    doc = (ROOT / "docs" / "plugin-hooks.md").read_text()
    documented = set(re.findall(r"^### `?(werk_[a-z_]+)", doc, flags=re.M))
    assert set(hook_names()) == documented


def test_every_hook_has_a_test() -> None:
    sources = "\n".join(p.read_text() for p in ROOT.glob("**/tests/**/test_*.py") if ".venv" not in p.parts)
    tested = {h for group in re.findall(r"@covers_hooks\(([^)]*)\)", sources) for h in re.findall(r'"(werk_\w+)"', group)}
    missing = set(hook_names()) - tested
    assert not missing, f"hooks without a @covers_hooks test: {sorted(missing)}"
    assert tested <= set(hook_names()), "a test claims to cover a hook that does not exist"


def test_every_operation_hook_is_declared() -> None:
    assert set(OPERATION_HOOKS) | {"werk_adapter_factories"} == set(hook_names())


# -- discovery and tolerant loading ------------------------------------------------------
@pytest.fixture
def fake_distributions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two installed distributions: one good plugin module, one whose import fails."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "werk_fake_good.py").write_text(
        textwrap.dedent(
            """
            from werk_host import hookimpl

            @hookimpl
            def werk_adapter_factories(config):
                return []
            """
        )
    )
    (site / "werk_fake_broken.py").write_text("raise ImportError('missing native library')\n")
    for dist, module in (("werk_fake_good", "werk_fake_good"), ("werk_fake_broken", "werk_fake_broken")):
        info = site / f"{dist}-1.2.3.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: 1.2.3\n")
        (info / "entry_points.txt").write_text(f"[werk]\n{dist.removeprefix('werk_fake_')} = {module}\n")
    monkeypatch.syspath_prepend(str(site))
    yield site
    for name in ("werk_fake_good", "werk_fake_broken"):
        sys.modules.pop(name, None)


def test_tolerant_loading_and_inventory(fake_distributions: Path) -> None:
    host = PluginHost()
    host.load_entry_points(environ={})
    records = {r["name"]: r for r in host.inventory()}
    assert records["good"]["status"] == "loaded"
    assert records["good"]["distribution"] == "werk-fake-good"
    assert records["good"]["version"] == "1.2.3"
    assert records["good"]["hooks"] == ["werk_adapter_factories"]
    assert records["broken"]["status"] == "failed"
    assert "missing native library" in records["broken"]["error"]


def test_disabled_plugins_are_listed_not_imported(fake_distributions: Path) -> None:
    host = PluginHost()
    host.load_entry_points(environ={"WERK_DISABLE_PLUGINS": "good, broken"})
    statuses = {r["name"]: r["status"] for r in host.inventory()}
    assert (statuses["good"], statuses["broken"]) == ("disabled", "disabled")
    assert "werk_fake_good" not in sys.modules


def test_werk_plugins_cli_lists_inventory(fake_distributions: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from werk_host.cli import main

    assert main(["plugins"]) == 0
    listed = {r["name"]: r["status"] for r in json.loads(capsys.readouterr().out)}
    assert listed["good"] == "loaded" and listed["broken"] == "failed"


def test_plugin_rejected_by_validation_is_reported() -> None:
    class Bad:
        @hookimpl
        def werk_prefill(self, adapter: Any, work: Any, unexpected_argument: Any) -> None:
            return None

    host = PluginHost()
    host.register(Bad(), "bad")
    (record,) = host.inventory()
    assert record["status"] == "failed" and "unexpected_argument" in record["error"]


# -- dispatch ----------------------------------------------------------------------------
class Observer:
    """A cross-cutting wrapper plugin: sees every prefill and decode of every backend."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    @hookimpl(wrapper=True)
    def werk_prefill(self, adapter: Any, work: PrefillWork) -> Any:
        self.seen.append(("prefill:before", adapter.backend))
        result = yield
        self.seen.append(("prefill:after", str(result.prompt_tokens)))
        return result

    @hookimpl(wrapper=True)
    def werk_decode(self, adapter: Any, work: DecodeWork) -> Any:
        self.seen.append(("decode:before", adapter.backend))
        result = yield
        self.seen.append(("decode:after", result.finish_reason))
        return result


def test_inline_wrapper_observes_every_prefill_and_decode(home: Path) -> None:
    observer = Observer()
    host = make_host(home, api_keys=(KEY,), plugin=MemoryBackendPlugin())
    host.plugins.register(observer, "observer")
    client = falcon.testing.TestClient(host.app, headers={"Authorization": f"Bearer {KEY}"})
    try:
        body = {"model_id": "tiny", "input": {"type": "text", "text": "one two three"}, "allow_experimental": True}
        prefill = client.simulate_post("/werk/v1/prefill", json=body)
        assert prefill.status_code == 200, prefill.text
        decode = client.simulate_post(
            "/werk/v1/decode", json={"handoff": prefill.json["data"]["handoff"], "allow_experimental": True}
        )
        assert decode.status_code == 200, decode.text
    finally:
        host.close()
    assert observer.seen == [
        ("prefill:before", BACKEND_ID),
        ("prefill:after", "3"),
        ("decode:before", BACKEND_ID),
        ("decode:after", "stop"),
    ]


class OtherBackend:
    """A second adapter-providing plugin that would answer every prefill if allowed to."""

    name = "other"

    @hookimpl
    def werk_adapter_factories(self, config: Any) -> list[Any]:
        return []

    @hookimpl
    def werk_prefill(self, adapter: Any, work: Any) -> Any:
        raise AssertionError("a foreign plugin answered another backend's prefill")


def test_only_the_owning_plugin_answers() -> None:
    host = PluginHost()
    plugin = MemoryBackendPlugin()
    host.register(plugin, "testbackend")
    host.register(OtherBackend(), "other")  # registered last: pluggy would call it first
    adapter = MemoryAdapter(model_name="tiny")
    work = PrefillWork("tiny", TextInput(type="text", text="a b"), want_snapshot=False)
    assert host.call("werk_prefill", adapter, work=work).prompt_tokens == 2


def test_require_reports_unsupported_for_unimplemented_hooks() -> None:
    host = PluginHost()
    host.register(MemoryBackendPlugin(), "testbackend")
    adapter = MemoryAdapter(model_name="tiny")
    with pytest.raises(WerkError) as err:
        host.require("werk_reasoning_profile", adapter, "reasoning", model="tiny", max_output_tokens=10)
    assert err.value.code.value == "unsupported"
    with pytest.raises(WerkError):
        host.require("werk_prefill", None, "prefill", work=None)


# -- one direct test per hook through the dispatcher -------------------------------------
@pytest.fixture
def dispatch() -> tuple[PluginHost, MemoryAdapter]:
    host = PluginHost()
    host.register(MemoryBackendPlugin(), "testbackend")
    return host, MemoryAdapter(model_name="tiny")


@covers_hooks("werk_adapter_factories")
def test_hook_werk_adapter_factories(dispatch: tuple[PluginHost, MemoryAdapter]) -> None:
    host, _ = dispatch
    (factory,) = host.adapter_factories(config=None)
    assert factory.backend == BACKEND_ID and factory.plugin_name == "testbackend"
    assert factory.accepts(None) is False


@covers_hooks("werk_capabilities")
def test_hook_werk_capabilities(dispatch: tuple[PluginHost, MemoryAdapter]) -> None:
    host, adapter = dispatch
    reports = host.call("werk_capabilities", adapter)
    assert reports["runtime.pd.prefill"].status.value == "experimental"


@covers_hooks("werk_producer_envelope")
def test_hook_werk_producer_envelope(dispatch: tuple[PluginHost, MemoryAdapter]) -> None:
    host, adapter = dispatch
    envelope = host.call("werk_producer_envelope", adapter, model_id="tiny")
    assert envelope["generation"] == adapter.generation


@covers_hooks("werk_prefill", "werk_snapshot", "werk_release_state")
def test_hook_werk_prefill_snapshot_restore_release(dispatch: tuple[PluginHost, MemoryAdapter]) -> None:
    host, adapter = dispatch
    state = host.call("werk_prefill", adapter, work=PrefillWork("tiny", TextInput(type="text", text="x y"), True))
    snapshot = host.call("werk_snapshot", adapter, state=state)
    assert b"".join(snapshot.chunks) == b"x y"
    assert host.call("werk_release_state", adapter, handle=state.handle) is True



@covers_hooks("werk_restore")
def test_hook_werk_restore(dispatch: tuple[PluginHost, MemoryAdapter]) -> None:
    import io
    from contextlib import contextmanager

    from werk_host.backend import StoredStateRef

    host, adapter = dispatch

    @contextmanager
    def opener() -> Any:
        yield io.BytesIO(b"p q r")

    ref = StoredStateRef("st_x", adapter.envelope(), 3, 5, {}, opener)
    state = host.call("werk_restore", adapter, stored=ref)
    assert state.prompt_tokens == 3


@covers_hooks("werk_decode")
def test_hook_werk_decode(dispatch: tuple[PluginHost, MemoryAdapter]) -> None:
    host, adapter = dispatch
    state = host.call("werk_prefill", adapter, work=PrefillWork("tiny", TextInput(type="text", text="a b c d"), False))
    out = host.call("werk_decode", adapter, work=DecodeWork(state.handle, None, DecodeOptions(max_tokens=2)))
    assert (out.text, out.finish_reason, out.completion_tokens) == ("a b", "length", 2)


@covers_hooks("werk_state_move")
def test_hook_werk_state_move(dispatch: tuple[PluginHost, MemoryAdapter]) -> None:
    host, adapter = dispatch
    with pytest.raises(WerkError) as err:
        host.call("werk_state_move", adapter, work=None)
    assert err.value.code.value == "unsupported"


@covers_hooks("werk_list_experts", "werk_expert_action")
def test_hook_werk_list_experts_and_expert_action(dispatch: tuple[PluginHost, MemoryAdapter]) -> None:
    host, adapter = dispatch
    # The test backend implements no expert hooks: the dispatcher reports "not implemented".
    assert host.call("werk_list_experts", adapter, query=None) is None
    assert host.call("werk_expert_action", adapter, request=None) is None



@covers_hooks("werk_count_tokens")
def test_hook_werk_count_tokens(dispatch: tuple[PluginHost, MemoryAdapter]) -> None:
    host, adapter = dispatch
    request = ChatRequest.model_validate({"messages": [{"role": "user", "content": "three little words"}]})
    assert host.call("werk_count_tokens", adapter, request=request) == 5


@covers_hooks("werk_chat_limits")
def test_hook_werk_chat_limits(dispatch: tuple[PluginHost, MemoryAdapter]) -> None:
    host, adapter = dispatch
    assert host.call("werk_chat_limits", adapter, model="tiny").max_output_tokens == 63


@covers_hooks("werk_reasoning_profile")
def test_hook_werk_reasoning_profile(dispatch: tuple[PluginHost, MemoryAdapter]) -> None:
    host, adapter = dispatch
    assert host.call("werk_reasoning_profile", adapter, model="tiny", max_output_tokens=64) is None


@covers_hooks("werk_chat_completion", "werk_list_models", "werk_text_completion")
def test_hook_werk_chat_completion_and_models(dispatch: tuple[PluginHost, MemoryAdapter]) -> None:
    host, adapter = dispatch
    response = host.call("werk_chat_completion", adapter, request={"messages": []})
    assert json.loads(b"".join(response.body))["object"] == "chat.completion"
    assert host.call("werk_list_models", adapter)[0]["id"] == "tiny"
    assert host.call("werk_text_completion", adapter, request={}) is None



@covers_hooks("werk_workers", "werk_memory_requirement")
def test_hook_werk_workers_and_memory_requirement(dispatch: tuple[PluginHost, MemoryAdapter]) -> None:
    host, adapter = dispatch
    assert host.call("werk_workers", adapter) is None
    assert host.call("werk_memory_requirement", adapter, operation="load", model_id="tiny") is None

