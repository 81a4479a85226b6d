"""``/v1`` admission on a real llama-server: the fit bound skips the exact count, answers stay exact.

Werk admits a chat request without counting it when an upper bound, calibrated from the
backend's own exact counts, proves it fits (``werk_host.service.admission``). These tests run
the generated test model and the real SmolLM2-135M-Instruct and observe every count: each call
of the adapter's ``count_tokens`` (recorded as ``"count"``; it may answer from its cache) and each
``/apply-template`` and ``/tokenize`` call it sends to the child, recorded by wrapping the
method and the module's ``post_json`` (the real calls still run). They show that

* a process's first plain requests are counted exactly, and the bound is calibrated in the
  ``CALIBRATE_AFTER``-th; after it, a request far below the limit is admitted and answered
  with no count call;
* requests just under and just over the limit get exactly the answers the exact count gives
  (admitted, or ``context_length_exceeded`` with the same numbers; ``output_limit_exceeded``
  unchanged), and those do pay the count;
* the bound is above the exact count for varied real requests, on both tokenizers;
* a template that renders content twice gets no bound (every request is counted), and one that
  does so only for some content is caught by the prompt tokens the child reports, after which
  Werk counts every request again.
"""

from __future__ import annotations

import random
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import werk_llamacpp.adapter as adapter_module
from werk_llamacpp.adapter import LlamaCppAdapter
from werk_llamacpp.process import ENV_ARGS

from werk_host.plugin import ChatRequest, HostConfig, ModelManifest
from werk_host.plugin.counting import CALIBRATE_AFTER, calibrate, plain_shape
from werk_host.testing.api import Api
from werk_host.testing.host import Host, ModelRegistry, build_host
from werk_host.testing.hosts import running

pytestmark = pytest.mark.llamaserver
KEY = "sk-werk-admission-test-123456"
MODEL = "adm"
CONTEXT = 512  # -c 1024 over -np 2: near-limit requests stay cheap to run
CEILING = 128
COUNT_PATHS = ("/apply-template", "/tokenize")
COUNTED = ["count", *COUNT_PATHS]  # an uncached exact count

#: Renders every message's content twice: the probes see it, so no bound is given.
TWICE_TEMPLATE = """\
{%- for message in messages %}<|im_start|>{{ message.role }}
{{ message.content }}{{ message.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

#: Repeats content only when it holds "magic": no probe does, so only the reported usage can tell.
MAGIC_TEMPLATE = """\
{%- for message in messages %}<|im_start|>{{ message.role }}
{% if 'magic' in message.content %}{{ message.content ~ message.content ~ message.content }}\
{% else %}{{ message.content }}{% endif %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


@dataclass
class Env:
    host: Host
    api: Api
    calls: list[str]  # counts and count calls to the child since the last ``take()``

    @property
    def adapter(self) -> LlamaCppAdapter:
        adapter = self.host.fleet.adapter
        assert isinstance(adapter, LlamaCppAdapter)
        return adapter

    def take(self) -> list[str]:
        calls, self.calls[:] = list(self.calls), []
        return calls

    def count(self, messages: list[dict[str, Any]]) -> int:
        status, body = self.api.post("/werk/v1/chat/count_tokens", {"messages": messages})
        assert status == 200, body
        tokens: int = body["data"]["input_tokens"]
        return tokens

    def chat(self, messages: list[dict[str, Any]], max_tokens: int, **extra: Any) -> tuple[int, dict[str, Any]]:
        request = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra}
        return self.api.post("/v1/chat/completions", request)


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every exact count (``"count"``) and every count call to the child (its path), in order."""
    calls: list[str] = []
    real_post, real_count = adapter_module.post_json, LlamaCppAdapter.count_tokens

    def post_json(pool: Any, path: str, body: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        if path in COUNT_PATHS:
            calls.append(path)
        return real_post(pool, path, body, **kwargs)

    def count_tokens(self: LlamaCppAdapter, request: ChatRequest) -> int:
        calls.append("count")
        return real_count(self, request)

    monkeypatch.setattr(adapter_module, "post_json", post_json)
    monkeypatch.setattr(LlamaCppAdapter, "count_tokens", count_tokens)
    return calls


@contextmanager
def serving(
    root: Path, llama_server: Path, model: Path, calls: list[str], template: str | None = None
) -> Iterator[Env]:
    home = root / "home"
    home.mkdir()
    manifest = ModelManifest.from_paths(MODEL, [model], backend="llama.cpp", params={"max_output_tokens": CEILING})
    ModelRegistry(home).add(manifest)
    args = ""
    if template is not None:
        (root / "chat.jinja").write_text(template)
        args = f"--chat-template-file {shlex.quote(str(root / 'chat.jinja'))}"
    config = HostConfig(
        home=home,
        api_keys=(KEY,),
        model=MODEL,
        backend_options={
            "llamacpp": {"llama_server": str(llama_server), "parallel": 2, "ctx": 2 * CONTEXT, "threads": 1}
        },
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV_ARGS, args)
        host = build_host(config)
    with running(host) as base:
        yield Env(host, Api(base, KEY), calls)


@pytest.fixture(params=["generated", "smollm2"])
def env(
    request: pytest.FixtureRequest, tmp_path: Path, llama_server_path: Path, tiny_model: Path, recorded: list[str]
) -> Iterator[Env]:
    model = tiny_model if request.param == "generated" else request.getfixturevalue("smollm2_gguf")
    with serving(tmp_path, llama_server_path, model, recorded) as env:
        yield env


def _fresh(text: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": f"{random.random()} {text}"}]


def _near(env: Env, target: int) -> tuple[list[dict[str, Any]], int]:
    """Messages whose exact count is in ``[target - 24, target]``, and that count."""
    words = ["state", "werk", "cache", "model", "prompt"]
    n = 8
    while True:
        messages = [{"role": "user", "content": " ".join(words[i % 5] for i in range(n))}]
        counted = env.count(messages)
        if counted >= target - 24:
            assert counted <= target, (counted, target)
            return messages, counted
        n += max((target - 24 - counted) // 3, 1)


def _calibrated(env: Env) -> None:
    """Send the plain requests in whose last Werk calibrates the bound; forget their calls."""
    for i in range(CALIBRATE_AFTER):
        status, body = env.chat(_fresh(f"calibrate {i}"), 2)
        assert status == 200, body
    env.take()


def test_far_below_the_limit_is_admitted_without_a_count(env: Env) -> None:
    for i in range(CALIBRATE_AFTER - 1):  # a process that answers a few requests never calibrates
        status, body = env.chat(_fresh(f"before the calibration {i}"), 4)
        assert status == 200, body
        assert env.take() == COUNTED, "the first plain requests of a process are counted exactly"
    status, body = env.chat(_fresh("this one calibrates"), 4)
    assert status == 200, body
    assert len(env.take()) > len(COUNTED), "this admission calibrates the bound from exact counts"
    for _ in range(3):
        messages = _fresh("hello there, how are you today?")
        status, body = env.chat(messages, 4)
        assert status == 200, body
        assert env.take() == [], "a far-below-limit request made a count call"
        assert body["usage"]["prompt_tokens"] == env.count(messages)  # the answer is the usual one
        env.take()
    # a multi-turn conversation too
    turns = [*_fresh("q1"), {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    status, body = env.chat(turns, 4)
    assert status == 200 and env.take() == [], body


def test_near_the_limit_answers_are_the_exact_ones(env: Env) -> None:
    _calibrated(env)
    messages, prompt = _near(env, CONTEXT - 8)
    env.take()

    # just under: input + output == context is admitted, on the exact count
    status, body = env.chat(messages, CONTEXT - prompt)
    assert status == 200, body
    assert body["usage"]["prompt_tokens"] == prompt
    assert env.take() == COUNTED, "the near-limit admission counts exactly"

    # just over: one more output token is refused with the exact numbers
    status, body = env.chat(messages, CONTEXT - prompt + 1)
    assert status == 400, body
    assert body["error"]["code"] == "context_length_exceeded"
    assert body["error"]["message"] == (
        f"input plus requested output needs {CONTEXT + 1} tokens; the context holds {CONTEXT}"
    )
    assert env.take() == COUNTED
    # a fresh prompt near the limit
    fresh = [{"role": "user", "content": "zz" + messages[0]["content"][2:]}]
    status, body = env.chat(fresh, CEILING)
    assert env.take() == COUNTED
    expected = env.count(fresh) + CEILING
    assert status == 400 and body["error"]["code"] == "context_length_exceeded", body
    assert f"needs {expected} tokens" in body["error"]["message"]
    # the output ceiling is checked before any count, as before
    status, body = env.chat(_fresh("short"), CEILING + 1)
    assert status == 400 and body["error"]["code"] == "output_limit_exceeded", body
    assert body["error"]["message"] == f"requested {CEILING + 1} output tokens; this model allows at most {CEILING}"


def test_every_admission_around_the_limit_matches_the_exact_rule(env: Env) -> None:
    _calibrated(env)
    for target in (CONTEXT - 40, CONTEXT - 4):  # outputs up to 64 tokens: cheap on the real model
        messages, prompt = _near(env, target)
        for output in (CONTEXT - prompt - 1, CONTEXT - prompt, CONTEXT - prompt + 1):
            if not 0 < output <= CEILING:
                continue
            env.take()
            status, body = env.chat(messages, output)
            if prompt + output <= CONTEXT:
                assert status == 200, (prompt, output, body)
                assert body["usage"]["prompt_tokens"] == prompt
                assert env.take() == COUNTED, "near the limit, admission counts exactly"
            else:
                assert status == 400 and body["error"]["code"] == "context_length_exceeded", (prompt, output)
                assert str(prompt + output) in body["error"]["message"]
                assert env.take() == COUNTED, "a rejection comes from the exact count"


def test_the_bound_is_above_the_exact_count_for_varied_requests(env: Env) -> None:
    hooks = env.host.fleet.hooks
    evidence = calibrate(env.adapter, hooks.count_tokens)
    assert evidence is not None
    pieces = ["hello", " ", "\n", "漢字", "🙂", "0123", "the", "<|im_end|>", "<s>", "é", "\t", "x", "ab", "  "]
    rng = random.Random(20)
    for _ in range(40):
        roles = (["system"] if rng.random() < 0.4 else []) + ["user", "assistant"] * rng.randint(0, 2) + ["user"]
        messages = [
            {"role": role, "content": "".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))} for role in roles
        ]
        request = ChatRequest.model_validate({"messages": messages})
        shape = plain_shape(request)
        assert shape is not None
        bound = evidence.bound(shape)
        exact = hooks.count_tokens(env.adapter, request)
        assert bound is not None and exact is not None
        assert exact <= bound, (messages, exact, bound)


def test_requests_outside_the_calibrated_shape_are_counted(env: Env) -> None:
    _calibrated(env)
    parts = [{"role": "user", "content": [{"type": "text", "text": "hello in parts"}]}]
    status, body = env.chat(parts, 4)
    assert status == 200, body
    assert env.take() == COUNTED
    status, body = env.chat(_fresh("with a template option"), 4, chat_template_kwargs={"enable_thinking": False})
    assert status == 200, body
    assert env.take() == COUNTED


def test_a_template_that_repeats_content_gets_no_bound(
    tmp_path: Path, llama_server_path: Path, tiny_model: Path, recorded: list[str]
) -> None:
    with serving(tmp_path, llama_server_path, tiny_model, recorded, TWICE_TEMPLATE) as env:
        assert calibrate(env.adapter, env.host.fleet.hooks.count_tokens) is None
        _calibrated(env)  # and finds no bound
        for _ in range(2):
            messages = _fresh("far below the limit")
            env.take()
            status, body = env.chat(messages, 4)
            assert status == 200, body
            assert env.take() == COUNTED
            assert body["usage"]["prompt_tokens"] == env.count(messages)


def test_reported_prompt_tokens_above_the_bound_withdraw_it(
    tmp_path: Path, llama_server_path: Path, tiny_model: Path, recorded: list[str]
) -> None:
    with serving(tmp_path, llama_server_path, tiny_model, recorded, MAGIC_TEMPLATE) as env:
        _calibrated(env)
        status, body = env.chat(_fresh("plain"), 2)
        assert status == 200 and env.take() == [], body  # calibrated: the probes saw no repetition

        magic = [{"role": "user", "content": "magic " + "0123456789" * 10}]
        status, body = env.chat(magic, 2)
        assert status == 200 and env.take() == [], body  # admitted on the bound ...
        bound = calibrate(env.adapter, env.host.fleet.hooks.count_tokens)
        assert bound is not None
        shape = plain_shape(ChatRequest.model_validate({"messages": magic}))
        assert shape is not None and body["usage"]["prompt_tokens"] > bound.bound(shape)  # ... which it broke
        env.take()

        # the child's own usage withdrew the evidence: from now on every request is counted
        status, body = env.chat(_fresh("plain again"), 2)
        assert status == 200, body
        assert env.take() == COUNTED
