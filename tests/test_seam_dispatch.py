"""Operation dispatch: a call on an adapter reaches its own methods and every wrapper plugin.

The host registers each adapter it creates with the plugin manager; a call on adapter X runs
X's hookimpl methods plus the ``wrapper=True`` impls of plugins that offer no adapters, never
another adapter's, also while other adapters register and close on other threads
(docs/architecture.md, "Operation dispatch").
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from werk_host import hookimpl
from werk_host.config import HostConfig
from werk_host.hooks import BackendHooks
from werk_host.pluginhost import PluginHost
from werk_host.protocol import TextInput
from werk_host.seam import Adapter, AdapterFactory, PrefilledState, PrefillWork
from werk_host.testing.reference import MemoryAdapter, MemoryBackendPlugin

CONFIG = HostConfig(home=Path("/nonexistent"))
WORK = PrefillWork("tiny", TextInput(type="text", text="a b"), want_snapshot=False)


class SecondAdapter(MemoryAdapter):
    """Another backend's adapter: its prefill counts one token more than the reference's."""

    @hookimpl(specname="werk_prefill")
    def prefill(self, work: PrefillWork) -> PrefilledState:
        state = super().prefill(work)
        state.prompt_tokens += 1
        return state


class SecondBackend(MemoryBackendPlugin):
    name = "second"  # type: ignore[misc]
    adapter_class = SecondAdapter

    @hookimpl
    def werk_adapter_factories(self, config: HostConfig) -> list[AdapterFactory]:
        return [AdapterFactory("second-backend", lambda m: True, self.create)]


class Wrapper:
    """A cross-cutting plugin (no factories): wraps every backend's prefill."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    @hookimpl(wrapper=True)
    def werk_prefill(self, adapter: Adapter, work: PrefillWork) -> Iterator[None]:
        result = yield
        with self._lock:
            self.seen.append((adapter.instance_id, result.prompt_tokens))  # type: ignore[attr-defined]
        return result


def _host() -> tuple[PluginHost, dict[str, AdapterFactory], Wrapper]:
    host = PluginHost()
    host.register(MemoryBackendPlugin(), "testbackend")
    host.register(SecondBackend(), "second")
    wrapper = Wrapper()
    host.register(wrapper, "audit")
    return host, {f.owner: f for f in host.adapter_factories(CONFIG)}, wrapper


def _created(host: PluginHost, factory: AdapterFactory, name: str) -> MemoryAdapter:
    adapter = factory.create(CONFIG, None)
    assert isinstance(adapter, MemoryAdapter)
    adapter.instance_id = name
    host.attach(adapter, factory)
    return adapter


def test_a_wrapper_wraps_every_backend_and_each_adapter_answers_its_own_calls() -> None:
    host, factories, wrapper = _host()
    first = _created(host, factories["testbackend"], "first")
    second = _created(host, factories["second"], "second")
    other = _created(host, factories["testbackend"], "other")  # same backend, another adapter
    hooks = BackendHooks(host)
    results = [hooks.prefill(a, WORK) for a in (first, second, other)]
    assert [r.prompt_tokens if r else None for r in results] == [2, 3, 2]
    assert wrapper.seen == [("first", 2), ("second", 3), ("other", 2)]
    assert (first.calls, second.calls, other.calls) == (["prefill"], ["prefill"], ["prefill"])
    assert host.owner_of(first) == "testbackend" and host.owner_of(second) == "second"


def test_a_closed_adapter_is_unregistered_and_answers_nothing() -> None:
    host, factories, _ = _host()
    adapter = _created(host, factories["testbackend"], "gone")
    assert host.operations_of(adapter) >= {"werk_prefill", "werk_decode"}
    host.detach(adapter)
    assert not [name for name, _ in host.pm.list_name_plugin() if "/adapter-" in name]


@pytest.mark.parametrize("rounds", [300])
def test_calls_on_one_adapter_stay_its_own_while_others_register_and_close(rounds: int) -> None:
    host, factories, wrapper = _host()
    steady = _created(host, factories["testbackend"], "steady")
    hooks = BackendHooks(host)
    stop = threading.Event()
    wrong: list[object] = []

    def call() -> None:
        while not stop.is_set():
            state = hooks.prefill(steady, WORK)
            if state is None or state.prompt_tokens != 2:
                wrong.append(state)

    def churn() -> None:
        for i in range(rounds):
            adapter = _created(host, factories["second" if i % 2 else "testbackend"], f"churn{i}")
            host.detach(adapter)

    callers = [threading.Thread(target=call) for _ in range(3)]
    for t in callers:
        t.start()
    churn()
    stop.set()
    for t in callers:
        t.join()
    assert not wrong
    assert steady.calls and set(steady.calls) == {"prefill"}
    assert {name for name, _ in wrapper.seen} == {"steady"}


def test_a_call_keeps_the_implementations_it_started_with_while_plugins_register() -> None:
    """The race the stress test above can only sometimes hit, made deterministic: while a call
    on one adapter runs, another adapter and a new wrapper register; the running call runs
    exactly the implementations it started with, the next call the new wrapper too."""
    host, factories, wrapper = _host()
    steady = _created(host, factories["testbackend"], "steady")
    late, joined = Wrapper(), []

    class Interloper:
        @hookimpl(wrapper=True)
        def werk_prefill(self, adapter: Adapter, work: PrefillWork) -> Iterator[None]:
            if not joined:  # registered between the call's start and its adapter's method
                joined.append(_created(host, factories["second"], "late"))
                host.register(late, "late-audit")
            return (yield)

    host.register(Interloper(), "interloper")
    hooks = BackendHooks(host)
    states = [hooks.prefill(steady, WORK), hooks.prefill(steady, WORK)]
    assert [s.prompt_tokens if s else None for s in states] == [2, 2]
    assert wrapper.seen == [("steady", 2), ("steady", 2)] and late.seen == [("steady", 2)]
    assert joined[0].calls == [] and steady.calls == ["prefill", "prefill"]
