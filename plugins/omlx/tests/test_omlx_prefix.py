"""``werk serve --persistence`` (auto/disk, reuse on): the worker-local exact-prefix cache, on real MLX.

Reuse must never change output: a request that shares a prefix with an earlier one reports
cached prompt tokens and answers exactly what stock mlx-lm answers for it. The worker's private
directory (``backends/omlx/workers/<id>/``) is in ``werk cache list`` as active while it runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import manifest_of
from werk_omlx import plugin
from werk_omlx.adapter import OmlxAdapter

from werk_host.plugin import PersistenceDefaults, PersistenceMode, ReusePolicy
from werk_host.testing.hosts import LiveHost, serving

pytestmark = pytest.mark.mlx

KEY = "sk-werk-omlx-prefix-0123456789"
SYSTEM = {"role": "system", "content": "You are a patient assistant who explains caches of experts. " * 3}


def stock(model_dir: Path, messages: list[dict[str, str]], n: int) -> str:
    from mlx_lm import generate, load

    model, tokenizer = load(str(model_dir))
    return str(
        generate(model, tokenizer, tokenizer.apply_chat_template(messages, add_generation_prompt=True), max_tokens=n)
    )


def chat(live: LiveHost, messages: list[dict[str, str]], n: int = 8) -> dict[str, Any]:
    status, doc = live.api.post("/v1/chat/completions", {"messages": messages, "max_tokens": n, "temperature": 0})
    assert status == 200, doc
    return doc


def cache_list(home: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "werk_host.cli", "cache", "list", "--home", str(home), "--json"],
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()
    entries: list[dict[str, Any]] = json.loads(done.stdout)["backend_caches"]
    return entries


@pytest.mark.parametrize("mode", [PersistenceMode.AUTO, PersistenceMode.DISK])
def test_persistence_reuses_exact_prefixes_without_changing_output(
    moe_f32: Path, tmp_path: Path, mode: PersistenceMode
) -> None:
    home = tmp_path / "home"
    first = [SYSTEM, {"role": "user", "content": "What is an expert?"}]
    second = [SYSTEM, {"role": "user", "content": "And what is a cache?"}]
    persistence = PersistenceDefaults(mode=mode, reuse=ReusePolicy.PREFER)
    with serving(
        home, plugin=plugin, plugin_name="omlx", model=manifest_of(moe_f32), api_keys=(KEY,), persistence=persistence
    ) as live:
        a = chat(live, first)
        assert a["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        b = chat(live, second)
        cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert 0 < cached < b["usage"]["prompt_tokens"]  # the shared system prompt, not the question
        again = chat(live, first)
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == again["usage"]["prompt_tokens"] - 1
        assert a["choices"][0]["message"]["content"] == stock(moe_f32, first, 8)
        assert b["choices"][0]["message"]["content"] == stock(moe_f32, second, 8)
        assert again["choices"][0]["message"]["content"] == a["choices"][0]["message"]["content"]

        adapter = live.host.fleet.adapter
        assert isinstance(adapter, OmlxAdapter)
        (worker,) = adapter.live_workers()
        entries = cache_list(home)
        ours = [e for e in entries if e["id"] == f"backend:omlx/workers/w-{worker.generation}"]
        assert len(ours) == 1 and ours[0]["active"] is True and ours[0]["bytes"] > 0, entries
        prefix = worker.status()["prefix_cache"]
        assert prefix["hits"] == 2 and prefix["entries"] >= 2
    assert cache_list(home) == []  # a worker stopped by Werk leaves nothing behind


@pytest.mark.parametrize(
    "persistence",
    [None, PersistenceDefaults(mode=PersistenceMode.MEMORY), PersistenceDefaults(reuse=ReusePolicy.DISABLED)],
    ids=["off", "memory-mode", "reuse-disabled"],
)
def test_without_auto_or_disk_reuse_nothing_is_cached(
    moe_f32: Path, tmp_path: Path, persistence: PersistenceDefaults | None
) -> None:
    messages = [SYSTEM, {"role": "user", "content": "What is an expert?"}]
    with serving(
        tmp_path / "home", plugin=plugin, plugin_name="omlx", model=manifest_of(moe_f32), api_keys=(KEY,),
        persistence=persistence,
    ) as live:  # fmt: skip
        chat(live, messages)
        doc = chat(live, messages)
        assert doc["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        adapter = live.host.fleet.adapter
        assert isinstance(adapter, OmlxAdapter)
        assert adapter.live_workers()[0].status()["prefix_cache"] is None
