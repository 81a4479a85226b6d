"""GGUF metadata, prompt rendering and request validation: the parts that need no engine."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import minijinja
import pytest
from werk_candle_bridge.gguf import GgufError, read_metadata
from werk_candle_bridge.template import RAW_ROLE, Message, PromptRenderer, engine_template
from werk_candle_bridge.wire import JobKind, parse_chat, parse_completion
from werk_llamacpp.testing.testmodel import CHATML_TEMPLATE

from werk_host.plugin import ErrorCode, WerkError

# -- GGUF metadata ---------------------------------------------------------------------------------


def test_metadata_of_a_generated_model(tiny_gguf: Path) -> None:
    meta = read_metadata(tiny_gguf)
    assert meta.architecture == "llama"
    assert meta.context_length == 4096
    assert meta.chat_template == CHATML_TEMPLATE
    assert (meta.bos_token, meta.eos_token, meta.unk_token) == ("<s>", "</s>", "<unk>")


def test_metadata_of_the_real_model(smollm2_gguf: Path) -> None:
    meta = read_metadata(smollm2_gguf)
    assert meta.architecture == "llama" and meta.context_length == 8192
    assert meta.chat_template is not None and "<|im_start|>" in meta.chat_template
    assert meta.eos_token == "<|im_end|>"


@pytest.mark.parametrize(
    "content",
    [
        b"not a gguf at all" * 10,
        b"GGUF" + struct.pack("<I", 1) + b"\0" * 32,  # version 1
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 40),  # a 1 TiB key
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 3) + b"abc" + struct.pack("<I", 99),
    ],
    ids=["magic", "version", "huge-string", "unknown-type"],
)
def test_unreadable_headers_fail_cleanly(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "secret-dir" / "bad.gguf"
    path.parent.mkdir()
    path.write_bytes(content)
    with pytest.raises(GgufError) as caught:
        read_metadata(path)
    assert "secret-dir" not in str(caught.value)


def test_truncated_header_fails(tiny_gguf: Path, tmp_path: Path) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes(tiny_gguf.read_bytes()[:300])
    with pytest.raises(GgufError, match="ends early"):
        read_metadata(path)


# -- rendering -------------------------------------------------------------------------------------

EDGY_TEMPLATE = "\n  {% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}  \n"


def _render_engine_template(original: str | None, messages: list[dict[str, Any]]) -> str:
    """Render :func:`engine_template` with the engine's MiniJinja settings (trim/lstrip blocks)."""
    env = minijinja.Environment(trim_blocks=True, lstrip_blocks=True)
    return str(env.render_str(engine_template(original), messages=messages, add_generation_prompt=True))


def test_the_engine_template_passes_a_raw_prompt_verbatim() -> None:
    raw = "  {{ not a template }} <|im_start|>\n"
    assert _render_engine_template(CHATML_TEMPLATE, [{"role": RAW_ROLE, "content": raw}]) == raw


@pytest.mark.parametrize("original", [CHATML_TEMPLATE, EDGY_TEMPLATE])
def test_the_engine_template_renders_chat_like_the_original(original: str) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    env = minijinja.Environment(trim_blocks=True, lstrip_blocks=True)
    alone = env.render_str(original, messages=messages, add_generation_prompt=True)
    assert _render_engine_template(original, messages) == alone


def test_renderer_renders_chatml() -> None:
    renderer = PromptRenderer(CHATML_TEMPLATE, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    text = renderer.render([Message("system", "Be brief."), Message("user", "hello")])
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"


def test_renderer_context() -> None:
    template = (
        "{{ bos_token }}|{{ eos_token }}|{{ unk_token }}|{{ enable_thinking }}|{{ add_generation_prompt }}|"
        "{{ messages | tojson }}|{{ messages[0]['content'].strip() }}|{{ date_string is defined }}"
        "|{{ reasoning_effort is defined }}|{{ tools is defined }}"
    )
    renderer = PromptRenderer(template, bos_token="<s>", eos_token="</s>", unk_token=None)
    text = renderer.render([Message("user", " <a&'b> ")])
    assert text == ('<s>|</s>|none|true|true|[{"role": "user", "content": " <a&\'b> "}]|<a&\'b>|true|false|false')


def test_template_refusals_are_invalid_requests() -> None:
    template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('the first message must be from the user') }}{% endif %}x"
    renderer = PromptRenderer(template, bos_token=None, eos_token=None, unk_token=None)
    with pytest.raises(WerkError) as caught:
        renderer.render([Message("assistant", "hi")])
    assert caught.value.code is ErrorCode.INVALID_REQUEST
    assert "the first message must be from the user" in caught.value.message


def test_a_model_without_template_refuses_chat() -> None:
    renderer = PromptRenderer(None, bos_token=None, eos_token=None, unk_token=None)
    with pytest.raises(WerkError, match="no chat template") as caught:
        renderer.render([Message("user", "hi")])
    assert caught.value.code is ErrorCode.INVALID_REQUEST


# -- request validation ----------------------------------------------------------------------------

MESSAGES = [{"role": "user", "content": "hi"}]


def _refused(body: dict[str, Any], chat: bool = True) -> str:
    with pytest.raises(WerkError) as caught:
        if chat:
            parse_chat(body, None)
        else:
            parse_completion(body, None)
    assert caught.value.code is ErrorCode.INVALID_REQUEST
    return caught.value.message


def test_chat_options_are_mapped() -> None:
    job = parse_chat(
        {
            "model": "m",
            "messages": MESSAGES,
            "max_completion_tokens": 7,
            "temperature": 0,
            "top_p": 0.9,
            "top_k": 40,
            "min_p": 0.05,
            "presence_penalty": 0.5,
            "frequency_penalty": -0.5,
            "repetition_penalty": 1.1,
            "stop": "\n",
            "logit_bias": {"12": -100, "7": 2.5},
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "n": 1,
            "user": "someone",
        },
        None,
    )
    assert job.kind is JobKind.CHAT and job.stream and job.include_usage
    s = job.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.top_k, s.min_p) == (7, 0.0, 0.9, 40, 0.05)
    assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty) == (0.5, -0.5, 1.1)
    assert s.stop == ("\n",) and s.logit_bias == ((12, -100.0), (7, 2.5)) and s.ignore_eos


def test_absent_max_tokens_takes_the_ceiling() -> None:
    assert parse_chat({"messages": MESSAGES}, 64).sampling.max_tokens == 64
    assert parse_chat({"messages": MESSAGES, "max_tokens": 3}, 64).sampling.max_tokens == 3
    assert parse_completion({"prompt": "x"}, None).sampling.max_tokens is None


def test_text_parts_are_joined() -> None:
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    job = parse_chat({"messages": [{"role": "user", "content": parts, "name": "me"}]}, None)
    assert job.messages == (Message("user", "one\ntwo"),)


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"seed": 1}, "seed"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"reasoning_effort": "low"}, "reasoning_effort"),
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"temperature": -1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": ["", "x"]}, "stop"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_chat_refusals_name_the_option(body: dict[str, Any], named: str) -> None:
    assert named in _refused({"messages": MESSAGES, **body})


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "tool", "content": "x", "tool_call_id": "1"}],
        [{"role": "assistant", "content": None, "tool_calls": []}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}],
        [],
    ],
    ids=["tool-role", "tool-calls", "image", "empty"],
)
def test_chat_refuses_what_it_cannot_render(messages: list[dict[str, Any]]) -> None:
    _refused({"messages": messages})


def test_completion_prompts() -> None:
    assert parse_completion({"prompt": ["once"]}, None).prompt == "once"
    assert "prompt" in _refused({"prompt": [1, 2, 3]}, chat=False)
    assert "prompt" in _refused({"prompt": ["a", "b"]}, chat=False)
    assert "echo" in _refused({"prompt": "x", "echo": True}, chat=False)
    assert "messages" in _refused({"prompt": "x", "messages": MESSAGES}, chat=False)
