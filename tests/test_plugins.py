"""The plugin framework: discovery, version checks, tolerant loading, typed dispatch, wrappers,
generated hook docs, and one test per hook against the reference plugin that implements all."""

from __future__ import annotations

import inspect
import io
import json
import re
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import falcon.testing
import pluggy
import pytest

from tests.conftest import KEY
from werk_host import hookimpl, hookspecs
from werk_host.config import HostConfig
from werk_host.errors import ErrorCode, WerkError
from werk_host.hookdocs import render
from werk_host.hooks import BackendHooks, needed
from werk_host.models import ModelManifest
from werk_host.pluginhost import OPERATION_HOOKS, PluginHost, hook_names, incompatibility
from werk_host.protocol import (
    CapabilityId,
    CapabilityStatus,
    ChatRequest,
    DeploymentPlan,
    ExpertActionRequest,
    ExpertListQuery,
    TextInput,
    Tier,
)
from werk_host.seam import (
    Adapter,
    AdapterFactory,
    CapabilityReport,
    DecodeOptions,
    DecodeWork,
    MemoryOperation,
    MoveWork,
    PrefilledState,
    PrefillWork,
    StoredStateRef,
)
from werk_host.testing.embeddings import EMBED_BACKEND, ReferenceEmbeddingPlugin
from werk_host.testing.hosts import make_host
from werk_host.testing.markers import covers_hooks
from werk_host.testing.media import MEDIA_BACKEND, ReferenceMediaPlugin
from werk_host.testing.reference import BACKEND_ID, CONTEXT_TOKENS, MemoryAdapter, MemoryBackendPlugin
from werk_host.testing.speech import SPEECH_BACKEND, ReferenceSpeechPlugin

ROOT = Path(__file__).resolve().parents[1]
#: The werk-host range a plugin built for this hook API declares.
API_RANGE = f"werk-host>={hookspecs.HOOK_API_VERSION},<0.{int(hookspecs.HOOK_API_VERSION.split('.')[1]) + 1}"


def test_hook_reference_is_generated_from_the_hookspecs() -> None:
    guide = (ROOT / "docs" / "plugin-hooks.md").read_text()
    assert render(guide) == guide, (
        "docs/plugin-hooks.md is stale: run python -m werk_host.hookdocs docs/plugin-hooks.md"
    )
    documented = set(re.findall(r"^### `(werk_[a-z_]+)`", guide, flags=re.M))
    assert documented == set(hook_names())


def test_every_hook_has_a_test() -> None:
    sources = "\n".join(p.read_text() for p in ROOT.glob("**/tests/**/test_*.py") if ".venv" not in p.parts)
    tested = {
        h for group in re.findall(r"@covers_hooks\(([^)]*)\)", sources) for h in re.findall(r'"(werk_\w+)"', group)
    }
    missing = set(hook_names()) - tested
    assert not missing, f"hooks without a @covers_hooks test: {sorted(missing)}"
    assert tested <= set(hook_names()), "a test claims to cover a hook that does not exist"


def attached(host: PluginHost, adapter: MemoryAdapter, owner: str = "testbackend") -> MemoryAdapter:
    """``adapter`` attached to ``host`` as if ``owner``'s factory had created it."""
    factory = next(f for f in host.adapter_factories(HostConfig(home=Path("/nonexistent"))) if f.owner == owner)
    host.attach(adapter, factory)
    return adapter


#: The operation hooks of media backends (docs/media.md), which the text reference leaves out.
MEDIA_HOOKS = frozenset({hookspecs.werk_image_limits.__name__, hookspecs.werk_image_generation.__name__})
SPEECH_HOOKS = frozenset({hookspecs.werk_speech_limits.__name__, hookspecs.werk_speech_synthesis.__name__})
EMBEDDING_HOOKS = frozenset(
    spec.__name__
    for spec in (hookspecs.werk_embedding_limits, hookspecs.werk_embed, hookspecs.werk_rerank, hookspecs.werk_tokenize)
)


def test_the_reference_plugin_implements_every_hook() -> None:
    host = PluginHost()
    plugin = MemoryBackendPlugin()
    host.register(plugin, "testbackend")
    collected = {caller.name for caller in host.pm.get_hookcallers(plugin) or []}
    assert collected == set(hook_names()) - OPERATION_HOOKS  # operations are the adapter's methods
    (factory,) = host.adapter_factories(HostConfig(home=Path("/nonexistent")))
    adapter = factory.create(HostConfig(home=Path("/nonexistent")), None)
    host.attach(adapter, factory)
    # the text reference does every operation but the media and embedding ones; their references do those
    assert host.operations_of(adapter) == OPERATION_HOOKS - MEDIA_HOOKS - SPEECH_HOOKS - EMBEDDING_HOOKS
    media = ReferenceMediaPlugin()
    host.register(media, MEDIA_BACKEND)
    config = HostConfig(home=Path("/nonexistent"))
    (media_factory,) = (f for f in host.adapter_factories(config) if f.owner == MEDIA_BACKEND)
    media_adapter = media_factory.create(HostConfig(home=Path("/nonexistent")), ModelManifest("pix", (), MEDIA_BACKEND))
    host.attach(media_adapter, media_factory)
    assert host.operations_of(media_adapter) == MEDIA_HOOKS | {"werk_capabilities"}
    speech = ReferenceSpeechPlugin()
    host.register(speech, SPEECH_BACKEND)
    (speech_factory,) = (f for f in host.adapter_factories(config) if f.owner == SPEECH_BACKEND)
    speech_adapter = speech_factory.create(config, ModelManifest("voice", (), SPEECH_BACKEND))
    host.attach(speech_adapter, speech_factory)
    assert host.operations_of(speech_adapter) == SPEECH_HOOKS | {"werk_capabilities"}
    embedder = ReferenceEmbeddingPlugin()
    host.register(embedder, EMBED_BACKEND)
    (embed_factory,) = (f for f in host.adapter_factories(config) if f.owner == EMBED_BACKEND)
    embed_adapter = embed_factory.create(config, ModelManifest("emb", (), EMBED_BACKEND))
    host.attach(embed_adapter, embed_factory)
    assert host.operations_of(embed_adapter) == EMBEDDING_HOOKS | {"werk_capabilities"}
    assert set(hook_names()) - {"werk_adapter_factories", "werk_doctor_checks", "werk_cli_commands"} == OPERATION_HOOKS


def test_no_host_call_site_names_a_hook_by_string() -> None:
    quoted = re.compile(r"""["'](werk_[a-z_]+)["']""")
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in (ROOT / "werk_host").rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if any(name in hook_names() for name in quoted.findall(line)) and "specname=" not in line
    ]
    assert not offenders, offenders


# -- discovery, versions and tolerant loading ----------------------------------------------
GOOD_PLUGIN = """
from werk_host import hookimpl
from werk_host.seam import AdapterFactory

@hookimpl
def werk_adapter_factories(config):
    return [AdapterFactory("fake", lambda m: False, None, capabilities={caps})]
"""


@pytest.fixture
def fake_distributions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Installed distributions: a good plugin, one whose import fails, one built for another hook
    API, one that declares no werk-host range, and one declaring a misspelled capability id."""
    site = tmp_path / "site"
    site.mkdir()
    dists = {
        # name: (module source, Requires-Dist lines)
        "good": (GOOD_PLUGIN.format(name="good", caps='("runtime.pd.prefill",)'), [API_RANGE]),
        "broken": ("raise ImportError('missing native library')\n", [API_RANGE]),
        "old": ("raise AssertionError('an incompatible plugin was imported')\n", ["werk-host<0.2"]),
        "undeclared": ("raise AssertionError('an undeclared plugin was imported')\n", ["requests"]),
        "typo": (
            GOOD_PLUGIN.format(name="typo", caps='("runtime.state.presistence",)'),
            [f"werk-host>={hookspecs.HOOK_API_VERSION}"],
        ),
    }
    for name, (source, requires) in dists.items():
        module = f"werk_fake_{name}"
        (site / f"{module}.py").write_text(textwrap.dedent(source))
        info = site / f"{module}-1.2.3.dist-info"
        info.mkdir()
        meta = ["Metadata-Version: 2.1", f"Name: werk-fake-{name}", "Version: 1.2.3"]
        meta += [f"Requires-Dist: {r}" for r in requires]
        (info / "METADATA").write_text("\n".join(meta) + "\n")
        (info / "entry_points.txt").write_text(f"[werk]\n{name} = {module}\n")
    monkeypatch.syspath_prepend(str(site))
    yield site
    for name in dists:
        sys.modules.pop(f"werk_fake_{name}", None)


def _records(host: PluginHost) -> dict[str, dict[str, object]]:
    return {str(r["name"]): r for r in host.inventory()}


def test_tolerant_loading_and_inventory(fake_distributions: Path) -> None:
    host = PluginHost()
    host.load_entry_points(environ={})
    records = _records(host)
    assert records["good"]["status"] == "loaded"
    assert records["good"]["distribution"] == "werk-fake-good"
    assert records["good"]["version"] == "1.2.3"
    assert records["good"]["hooks"] == ["werk_adapter_factories"]
    assert records["broken"]["status"] == "failed"
    assert "missing native library" in str(records["broken"]["error"])


def test_plugins_for_another_hook_api_fail_before_import(fake_distributions: Path) -> None:
    host = PluginHost()
    host.load_entry_points(environ={})
    records = _records(host)
    assert records["old"]["status"] == "failed"
    assert "requires werk-host<0.2" in str(records["old"]["error"])
    assert f"hook API {hookspecs.HOOK_API_VERSION}" in str(records["old"]["error"])
    assert records["undeclared"]["status"] == "failed"
    assert "declares no werk-host requirement" in str(records["undeclared"]["error"])
    assert "werk_fake_old" not in sys.modules and "werk_fake_undeclared" not in sys.modules
    assert host.pm.get_plugin("old") is None  # never half-loaded


def test_version_ranges_are_checked_against_the_host_version() -> None:
    class Dist:
        def __init__(self, *requires: str) -> None:
            self.requires = list(requires)

    assert incompatibility(Dist("werk-host>=0.2,<0.3"), "0.2.5") is None  # type: ignore[arg-type]
    assert incompatibility(Dist("werk_host>=0.2"), "0.2.0") is None  # type: ignore[arg-type]
    assert incompatibility(Dist("werk-host>=0.3"), "0.2.0") is not None  # type: ignore[arg-type]
    assert incompatibility(Dist("werk-host<1; python_version < '3'", "werk-host>=0.2"), "0.2.0") is None  # type: ignore[arg-type]
    assert incompatibility(None, "0.2.0") is None  # registered in process, not from a distribution


def test_disabled_plugins_are_listed_not_imported(fake_distributions: Path) -> None:
    host = PluginHost()
    host.load_entry_points(environ={"WERK_DISABLE_PLUGINS": "good, broken"})
    records = _records(host)
    assert (records["good"]["status"], records["broken"]["status"]) == ("disabled", "disabled")
    assert "werk_fake_good" not in sys.modules


def test_werk_plugins_flags_unknown_capability_ids(
    fake_distributions: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from werk_host.cli import main

    monkeypatch.setenv("WERK_HOME", str(tmp_path / "home"))
    assert main(["plugins", "--json"]) == 0
    listed = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert listed["good"]["status"] == "loaded" and listed["good"]["problems"] == []
    assert listed["broken"]["status"] == "failed"
    assert listed["typo"]["problems"] == ["declares unknown capability id 'runtime.state.presistence'"]


def test_reported_unknown_capability_ids_are_flagged_not_dropped_silently() -> None:
    class Typo(MemoryAdapter):
        @hookimpl(specname="werk_capabilities")
        def capabilities(self) -> dict[str, CapabilityReport]:  # type: ignore[override]
            return {
                "runtime.pd.prefill": CapabilityReport(CapabilityStatus.SUPPORTED, "ok"),
                "runtime.pd.prefil": CapabilityReport(CapabilityStatus.SUPPORTED, "misspelled"),
            }

    host = PluginHost()
    host.register(MemoryBackendPlugin(), "testbackend")
    reports = BackendHooks(host).capabilities(attached(host, Typo(model_name="tiny")))
    assert reports == {CapabilityId.PD_PREFILL: CapabilityReport(CapabilityStatus.SUPPORTED, "ok")}
    assert _records(host)["testbackend"]["problems"] == ["reports unknown capability id 'runtime.pd.prefil'"]


def test_plugin_rejected_by_validation_is_reported() -> None:
    class Bad:
        @hookimpl
        def werk_prefill(self, adapter: Adapter, work: PrefillWork, unexpected_argument: object) -> None:
            return None

    host = PluginHost()
    host.register(Bad(), "bad")
    (record,) = host.inventory()
    assert record["status"] == "failed" and "unexpected_argument" in str(record["error"])


# -- dispatch ----------------------------------------------------------------------------
class Observer:
    """A cross-cutting wrapper plugin: sees every prefill and decode of every backend."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    @hookimpl(wrapper=True)
    def werk_prefill(self, adapter: Adapter, work: PrefillWork) -> Iterator[None]:
        self.seen.append(("prefill:before", adapter.backend))
        result = yield
        self.seen.append(("prefill:after", str(result.prompt_tokens)))  # type: ignore[attr-defined]
        return result

    @hookimpl(wrapper=True)
    def werk_decode(self, adapter: Adapter, work: DecodeWork) -> Iterator[None]:
        self.seen.append(("decode:before", adapter.backend))
        result = yield
        self.seen.append(("decode:after", result.finish_reason))  # type: ignore[attr-defined]
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


def test_a_wrapper_registered_after_a_call_sees_the_next_one() -> None:
    """The implementations a call runs are kept per hook and adapter; registering a wrapper
    drops them, so the wrapper is not bypassed."""
    host = PluginHost()
    host.register(MemoryBackendPlugin(), "testbackend")
    hooks = BackendHooks(host)
    adapter = attached(host, MemoryAdapter(model_name="tiny"))
    work = PrefillWork("tiny", TextInput(type="text", text="a b"), want_snapshot=False)
    first = hooks.prefill(adapter, work)
    assert first is not None and first.prompt_tokens == 2
    observer = Observer()
    host.register(observer, "observer")
    second = hooks.prefill(adapter, work)
    assert second is not None and second.prompt_tokens == 2
    assert observer.seen == [("prefill:before", BACKEND_ID), ("prefill:after", "2")]


class OtherBackend:
    """A second adapter-providing plugin that would answer every prefill if allowed to."""

    @hookimpl
    def werk_adapter_factories(self, config: HostConfig) -> list[AdapterFactory]:
        return []

    @hookimpl
    def werk_prefill(self, adapter: Adapter, work: PrefillWork) -> PrefilledState:
        raise AssertionError("a foreign plugin answered another backend's prefill")


class OldStyleReference(MemoryBackendPlugin):
    """The reference plugin answering an operation for its own adapters itself (the hook API 0.2 form)."""

    @hookimpl
    def werk_chat_limits(self, adapter: MemoryAdapter, model: str | None) -> None:
        raise AssertionError("a plugin object answered its adapter's operation")


class AuditingBackend(MemoryBackendPlugin):
    """A backend plugin that also wraps every backend's prefill (a wrapper, not an answer)."""

    name = "auditing"  # type: ignore[misc]

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    @hookimpl(wrapper=True)
    def werk_prefill(self, adapter: Adapter, work: PrefillWork) -> Iterator[None]:
        self.seen.append(adapter.instance_id)
        return (yield)


def test_only_the_owning_plugin_answers() -> None:
    host = PluginHost()
    host.register(MemoryBackendPlugin(), "testbackend")
    host.register(OtherBackend(), "other")  # registered last: pluggy would call it first
    work = PrefillWork("tiny", TextInput(type="text", text="a b"), want_snapshot=False)
    state = BackendHooks(host).prefill(attached(host, MemoryAdapter(model_name="tiny")), work)
    assert state is not None and state.prompt_tokens == 2


def test_a_plugin_object_offering_factories_that_answers_an_operation_itself_is_failed() -> None:
    """Registered in process as installed: an operation reaches a backend only as its adapter's
    method. The plugin is ``failed`` with the hooks named, offers no factory and answers nothing."""
    host = PluginHost()
    host.register(OtherBackend(), "other")
    host.register(OldStyleReference(), "testbackend")
    records = _records(host)
    for name, hooks in (("other", "werk_prefill"), ("testbackend", "werk_chat_limits")):
        assert records[name]["status"] == "failed" and records[name]["hooks"] == []
        assert f"its plugin object implements operation hooks itself ({hooks}), the hook API 0.2 form" in str(
            records[name]["error"]
        )
    assert host.adapter_factories(HostConfig(home=Path("/nonexistent"))) == []
    limits = BackendHooks(host).chat_limits(MemoryAdapter(model_name="tiny"), "tiny")  # its method only
    assert limits is not None and limits.context_tokens == CONTEXT_TOKENS


def test_a_backend_plugins_wrapper_wraps_every_backend() -> None:
    host = PluginHost()
    host.register(MemoryBackendPlugin(), "testbackend")
    auditing = AuditingBackend()
    host.register(auditing, "auditing")
    assert _records(host)["auditing"]["status"] == "loaded"
    work = PrefillWork("tiny", TextInput(type="text", text="a b"), want_snapshot=False)
    hooks = BackendHooks(host)
    mine = attached(host, MemoryAdapter(model_name="tiny", instance_id="mine"), owner="auditing")
    theirs = attached(host, MemoryAdapter(model_name="tiny", instance_id="theirs"))
    assert [s.prompt_tokens if s else None for s in (hooks.prefill(mine, work), hooks.prefill(theirs, work))] == [2, 2]
    assert auditing.seen == ["mine", "theirs"]


def test_a_plugin_that_fails_later_answers_nothing_more() -> None:
    """An adapter attached before its plugin failed is refused from then on (never re-attached as
    one built by hand), and a failed wrapper leaves every adapter's calls."""
    host = PluginHost()
    host.register(MemoryBackendPlugin(), "testbackend")
    observer = Observer()
    host.register(observer, "observer")
    work = PrefillWork("tiny", TextInput(type="text", text="a b"), want_snapshot=False)
    hooks = BackendHooks(host)
    adapter = attached(host, MemoryAdapter(model_name="tiny"))
    assert hooks.prefill(adapter, work) is not None and len(observer.seen) == 2
    host.fail("observer", "a planted defect")
    assert hooks.prefill(adapter, work) is not None and len(observer.seen) == 2
    host.fail("testbackend", "a planted defect")
    with pytest.raises(WerkError) as refused:
        hooks.prefill(adapter, work)
    assert refused.value.code is ErrorCode.INTERNAL and "plugin testbackend failed" in refused.value.message
    assert adapter.calls == ["prefill", "prefill"]


def test_the_private_pluggy_call_dispatch_relies_on_is_as_tested() -> None:
    """werk_host/pluginhost.py runs an adapter's implementations with pluggy's private
    ``PluginManager._hookexec`` (measured faster than the public hook call): this fails loudly
    when a pluggy release changes it, and pyproject.toml pins pluggy below 2."""
    assert pluggy.__version__.split(".")[0] == "1", f"dispatch is tested with pluggy 1.x, not {pluggy.__version__}"
    params = list(inspect.signature(pluggy.PluginManager._hookexec).parameters)
    assert params == ["self", "hook_name", "methods", "kwargs", "firstresult"], params
    host = PluginHost()
    host.register(MemoryBackendPlugin(), "testbackend")
    observer = Observer()
    host.register(observer, "observer")
    adapter = attached(host, MemoryAdapter(model_name="tiny"))
    state = host.dispatch(
        "werk_prefill", adapter, work=PrefillWork("tiny", TextInput(type="text", text="a b c"), want_snapshot=False)
    )
    assert isinstance(state, PrefilledState) and state.prompt_tokens == 3  # firstresult: one answer, not a list
    assert observer.seen == [("prefill:before", BACKEND_ID), ("prefill:after", "3")]


class BareAdapter:
    """An adapter with no operation methods."""

    instance_id = "bare:tiny"
    backend = BACKEND_ID

    def identity(self) -> str:
        return self.instance_id

    def close(self) -> None:
        pass


class FactoriesOnly:
    """A backend that implements nothing but its factory: every operation is "not implemented"."""

    @hookimpl
    def werk_adapter_factories(self, config: HostConfig) -> list[AdapterFactory]:
        return [AdapterFactory(BACKEND_ID, lambda m: True, lambda c, m: BareAdapter())]


def test_none_from_a_hook_is_unsupported_over_http(home: Path) -> None:
    host = make_host(home, api_keys=(KEY,), plugin=FactoriesOnly(), plugin_name="testbackend")
    client = falcon.testing.TestClient(host.app, headers={"Authorization": f"Bearer {KEY}"})
    try:
        caps = client.simulate_get("/werk/v1/capabilities").json["data"]
        backend_ids = {c["id"]: c["status"] for c in caps if not c["id"].startswith("runtime.memory")}
        assert set(backend_ids.values()) == {"unsupported"}
        body = {"model_id": "tiny", "input": {"type": "text", "text": "x"}, "allow_experimental": True}
        assert client.simulate_post("/werk/v1/prefill", json=body).status_code == 501
    finally:
        host.close()


class WrongTypes(MemoryAdapter):
    @hookimpl(specname="werk_chat_limits")
    def chat_limits(self, model: str | None) -> dict[str, int]:  # type: ignore[override]
        return {"context_tokens": 64}

    @hookimpl(specname="werk_count_tokens")
    def count_tokens(self, request: ChatRequest) -> bool:  # type: ignore[override]
        return True


def test_a_wrongly_typed_answer_is_an_internal_plugin_defect() -> None:
    host = PluginHost()
    host.register(MemoryBackendPlugin(), "testbackend")
    hooks = BackendHooks(host)
    adapter = attached(host, WrongTypes(model_name="tiny"))
    with pytest.raises(WerkError) as err:
        hooks.chat_limits(adapter, "tiny")
    assert err.value.code is ErrorCode.INTERNAL and "plugin testbackend" in err.value.message
    request = ChatRequest.model_validate({"messages": [{"role": "user", "content": "hi"}]})
    with pytest.raises(WerkError):
        hooks.count_tokens(adapter, request)


def test_needed_turns_not_implemented_into_unsupported() -> None:
    adapter = MemoryAdapter(model_name="tiny")
    assert needed(3, "counting", adapter) == 3
    with pytest.raises(WerkError) as err:
        needed(None, "counting", adapter)
    assert err.value.code is ErrorCode.UNSUPPORTED and BACKEND_ID in err.value.message


# -- one direct test per hook, through the typed facade, against the reference plugin ------
@pytest.fixture
def facade() -> tuple[BackendHooks, MemoryAdapter, PluginHost]:
    host = PluginHost()
    host.register(MemoryBackendPlugin(), "testbackend")
    return BackendHooks(host), attached(host, MemoryAdapter(model_name="tiny")), host


def _text(text: str) -> PrefillWork:
    return PrefillWork("tiny", TextInput(type="text", text=text), want_snapshot=True)


@covers_hooks("werk_adapter_factories")
def test_hook_werk_adapter_factories(facade: tuple[BackendHooks, MemoryAdapter, PluginHost], tmp_path: Path) -> None:
    _, _, host = facade
    (factory,) = host.adapter_factories(HostConfig(home=tmp_path))
    assert factory.backend == BACKEND_ID and factory.plugin_name == "testbackend"
    assert factory.accepts(None) is False
    assert set(factory.capabilities) <= set(CapabilityId) and factory.capabilities


@covers_hooks("werk_capabilities")
def test_hook_werk_capabilities(facade: tuple[BackendHooks, MemoryAdapter, PluginHost]) -> None:
    hooks, adapter, _ = facade
    reports = hooks.capabilities(adapter)
    assert reports is not None
    assert reports[CapabilityId.PD_PREFILL].status is CapabilityStatus.EXPERIMENTAL
    adapter.statuses[CapabilityId.PD_PREFILL] = CapabilityStatus.UNAVAILABLE
    reports = hooks.capabilities(adapter)
    assert reports is not None and reports[CapabilityId.PD_PREFILL].status is CapabilityStatus.UNAVAILABLE


@covers_hooks("werk_compat_key")
def test_hook_werk_compat_key(facade: tuple[BackendHooks, MemoryAdapter, PluginHost]) -> None:
    hooks, adapter, _ = facade
    compat_key = hooks.compat_key(adapter, "tiny")
    assert compat_key is not None and compat_key["generation"] == adapter.generation
    adapter.restart()
    assert hooks.compat_key(adapter, "tiny") != compat_key


@covers_hooks("werk_prefill", "werk_snapshot", "werk_release_state")
def test_hook_werk_prefill_snapshot_release(facade: tuple[BackendHooks, MemoryAdapter, PluginHost]) -> None:
    hooks, adapter, _ = facade
    state = needed(hooks.prefill(adapter, _text("x y")), "prefill", adapter)
    assert state.prompt_tokens == 2
    snapshot = needed(hooks.snapshot(adapter, state), "snapshot", adapter)
    assert b"".join(snapshot.chunks) == b"x y"
    assert hooks.release_state(adapter, state.handle) is True
    assert hooks.release_state(adapter, state.handle) is False


@contextmanager
def _payload(data: bytes) -> Iterator[BinaryIO]:
    yield io.BytesIO(data)


@covers_hooks("werk_restore")
def test_hook_werk_restore(facade: tuple[BackendHooks, MemoryAdapter, PluginHost]) -> None:
    hooks, adapter, _ = facade
    ref = StoredStateRef("st_x", adapter.compat_key_now(), 3, 5, {}, lambda: _payload(b"p q r"))
    state = needed(hooks.restore(adapter, ref), "restore", adapter)
    out = needed(hooks.decode(adapter, DecodeWork(state.handle, None, DecodeOptions(max_tokens=8))), "decode", adapter)
    assert (state.prompt_tokens, out.text) == (3, "p q r")


@covers_hooks("werk_decode")
def test_hook_werk_decode(facade: tuple[BackendHooks, MemoryAdapter, PluginHost]) -> None:
    hooks, adapter, _ = facade
    state = needed(hooks.prefill(adapter, _text("a b c d")), "prefill", adapter)
    out = needed(hooks.decode(adapter, DecodeWork(state.handle, None, DecodeOptions(max_tokens=2))), "decode", adapter)
    assert (out.text, out.finish_reason, out.completion_tokens) == ("a b", "length", 2)


@covers_hooks("werk_state_move")
def test_hook_werk_state_move(facade: tuple[BackendHooks, MemoryAdapter, PluginHost]) -> None:
    hooks, adapter, _ = facade
    ref = StoredStateRef("st_x", adapter.compat_key_now(), 1, 1, {}, lambda: _payload(b"z"))
    with pytest.raises(WerkError) as err:  # the default reference backend holds no ram tier
        hooks.state_move(adapter, MoveWork(ref, "promote", Tier.RAM, dry_run=True))
    assert err.value.code is ErrorCode.UNSUPPORTED
    adapter.statuses[CapabilityId.TIER_RAM] = CapabilityStatus.EXPERIMENTAL
    moved = needed(hooks.state_move(adapter, MoveWork(ref, "promote", Tier.RAM, dry_run=True)), "move", adapter)
    assert moved.tier is Tier.RAM


@covers_hooks("werk_list_experts", "werk_expert_action")
def test_hook_werk_list_experts_and_expert_action(facade: tuple[BackendHooks, MemoryAdapter, PluginHost]) -> None:
    hooks, adapter, _ = facade
    page = needed(hooks.list_experts(adapter, ExpertListQuery()), "experts", adapter)
    assert page.experts
    first = page.experts[0]
    pin = ExpertActionRequest(model_id=first.model_id, expert_ids=[first.id], action="pin", dry_run=True)
    result = needed(hooks.expert_action(adapter, pin), "expert action", adapter)
    assert result.dry_run is True and result.experts[0].pinned is True
    after = needed(hooks.list_experts(adapter, ExpertListQuery()), "experts", adapter)
    assert after.experts[0].pinned is False  # a dry run changed nothing
    real = needed(hooks.expert_action(adapter, pin.model_copy(update={"dry_run": False})), "expert action", adapter)
    assert real.changed is True
    assert needed(hooks.list_experts(adapter, ExpertListQuery()), "experts", adapter).experts[0].pinned is True


@covers_hooks("werk_count_tokens")
def test_hook_werk_count_tokens(facade: tuple[BackendHooks, MemoryAdapter, PluginHost]) -> None:
    hooks, adapter, _ = facade
    request = ChatRequest.model_validate({"messages": [{"role": "user", "content": "three little words"}]})
    assert hooks.count_tokens(adapter, request) == 5


@covers_hooks("werk_chat_limits")
def test_hook_werk_chat_limits(facade: tuple[BackendHooks, MemoryAdapter, PluginHost]) -> None:
    hooks, adapter, _ = facade
    limits = needed(hooks.chat_limits(adapter, "tiny"), "limits", adapter)
    assert (limits.context_tokens, limits.max_output_tokens) == (64, 63)


@covers_hooks("werk_reasoning_profile")
def test_hook_werk_reasoning_profile(facade: tuple[BackendHooks, MemoryAdapter, PluginHost]) -> None:
    hooks, adapter, _ = facade
    profile = needed(hooks.reasoning_profile(adapter, "tiny", 64), "reasoning", adapter)
    assert profile.supported is True and profile.tiers


@covers_hooks("werk_chat_completion", "werk_text_completion")
def test_hook_werk_completions(facade: tuple[BackendHooks, MemoryAdapter, PluginHost]) -> None:
    hooks, adapter, _ = facade
    messages = [{"role": "user", "content": "three little words"}]
    response = needed(hooks.chat_completion(adapter, {"messages": messages}), "chat", adapter)  # type: ignore[dict-item]
    doc = json.loads(b"".join(response.body))
    assert doc["object"] == "chat.completion" and doc["usage"]["prompt_tokens"] == 5
    text = needed(hooks.text_completion(adapter, {"prompt": "a b"}), "completions", adapter)
    assert json.loads(b"".join(text.body))["object"] == "text_completion"


@covers_hooks("werk_workers", "werk_memory_requirement")
def test_hook_werk_workers_and_memory_requirement(facade: tuple[BackendHooks, MemoryAdapter, PluginHost]) -> None:
    hooks, adapter, _ = facade
    (worker,) = needed(hooks.workers(adapter), "workers", adapter)
    assert worker.model == "tiny"
    assert hooks.memory_requirement(adapter, MemoryOperation.LOAD, "tiny") is None
    adapter.memory_requirement = 4096
    assert hooks.memory_requirement(adapter, MemoryOperation.LOAD, "tiny") == 4096


@covers_hooks("werk_deployment_plan")
def test_hook_werk_deployment_plan(facade: tuple[BackendHooks, MemoryAdapter, PluginHost]) -> None:
    hooks, adapter, _ = facade
    plan = needed(hooks.deployment_plan(adapter), "plan", adapter)
    assert (plan.parallel_slots, plan.context_per_slot, plan.device) == (1, 64, "cpu")
    adapter.close()
    assert hooks.deployment_plan(adapter) is None


@covers_hooks("werk_log_tail")
def test_hook_werk_log_tail(facade: tuple[BackendHooks, MemoryAdapter, PluginHost]) -> None:
    """The backend's own log tail, cut to ``lines`` and redacted again by the facade: paths and
    process ids become placeholders whatever the plugin sent; ``None`` once nothing runs."""
    hooks, adapter, _ = facade
    assert needed(hooks.log_tail(adapter, 5), "log tail", adapter) == ["loaded model tiny"]
    adapter.native_log += ["opened /srv/models/tiny.gguf", "worker pid=4242 ready", "\x1b[1mbold\x1b[0m"]
    assert hooks.log_tail(adapter, 3) == ["opened <path>", "worker pid=<pid> ready", "bold"]
    assert hooks.log_tail(adapter, 1) == ["bold"]
    adapter.close()
    assert hooks.log_tail(adapter, 5) is None


class RefusingAdapter(MemoryAdapter):
    """The reference adapter whose prefill refuses every request and that has no plan."""

    @hookimpl(specname="werk_prefill")
    def prefill(self, work: PrefillWork) -> PrefilledState:
        raise WerkError(ErrorCode.RESOURCE_EXHAUSTED, f"no room for {work.model_id}")

    @hookimpl(specname="werk_deployment_plan")
    def deployment_plan(self) -> DeploymentPlan | None:
        return None


def test_one_plain_implementation_is_called_as_pluggy_calls_it() -> None:
    """Dispatch calls a lone plain implementation directly (werk_host/pluginhost.py ``_call``,
    measured in docs/architecture.md): its result, its ``None`` and its exception are exactly
    what pluggy's own call of the same list gives; a wrapper registered later still wraps."""
    host = PluginHost()
    host.register(MemoryBackendPlugin(), "testbackend")
    work = PrefillWork("tiny", TextInput(type="text", text="a b c"), want_snapshot=False)

    def both(adapter: MemoryAdapter, hook: str, **kwargs: object) -> tuple[object, object]:
        """(dispatch's answer, pluggy's answer), each a result or the exception raised."""
        plugin = host._plugin(adapter)
        impls = plugin.hooks[hook].get_hookimpls()
        assert len(impls) == 1 and not impls[0].wrapper  # the direct path is the one taken
        answers: list[object] = []
        for call in (
            lambda: host.dispatch(hook, adapter, **kwargs),
            lambda: plugin.pm._hookexec(hook, impls, {**kwargs, "adapter": adapter}, True),
        ):
            try:
                answers.append(call())
            except WerkError as err:
                answers.append((err.code, err.message))
        return answers[0], answers[1]

    adapter = attached(host, MemoryAdapter(model_name="tiny"))
    mine, theirs = both(adapter, "werk_prefill", work=work)
    assert isinstance(mine, PrefilledState) and isinstance(theirs, PrefilledState)
    assert mine.prompt_tokens == theirs.prompt_tokens == 3
    limits, expected = both(adapter, "werk_chat_limits", model="tiny")
    assert limits == expected and limits is not None
    refusing = attached(host, RefusingAdapter(model_name="tiny"))
    assert both(refusing, "werk_deployment_plan") == (None, None)  # None passes as pluggy passes it
    refused = both(refusing, "werk_prefill", work=work)
    assert refused[0] == refused[1] == (ErrorCode.RESOURCE_EXHAUSTED, "no room for tiny")
    observer = Observer()
    host.register(observer, "observer")
    host.dispatch("werk_prefill", adapter, work=work)
    assert observer.seen == [("prefill:before", BACKEND_ID), ("prefill:after", "3")]
