"""The engine seam against the real mistralrs: Werk's rendering equals the engine's own, a raw
prompt is tokenized as counted, panics are contained, and memory is handed back."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
from werk_candle_bridge.engine import EngineFailure, EngineSettings, Sampling, engine_call, load_engine
from werk_candle_bridge.gguf import read_metadata
from werk_candle_bridge.template import RAW_ROLE, Message, PromptRenderer, engine_template

pytestmark = pytest.mark.engine

#: Exercises what the engine puts in a template's context and how it prints it.
KITCHEN_SINK = (
    "{{ bos_token }}{% for m in messages %}{% if loop.first and m['role'] != 'system' %}<|im_start|>system\n"
    "default{{ eos_token }}{{ unk_token }}<|im_end|>\n{% endif %}<|im_start|>{{ m['role'] }}\n"
    "{{ m['content'].strip() | trim }}<|im_end|>\n{% endfor %}"
    "{%- if enable_thinking is defined %}[think={{ enable_thinking }}]{% endif %}"
    "{%- if reasoning_effort is defined %}[effort={{ reasoning_effort }}]{% endif %}"
    "{%- if date_string is defined %}[date={{ date_string }}]{% endif %}"
    "{%- if tools is defined %}[tools]{% endif %}\n"
    "{{ messages | tojson }}\n"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CONVERSATIONS = [
    [Message("user", "  hello <world> & 'x'  ")],
    [Message("system", "Be brief."), Message("user", "Hi."), Message("assistant", "Hello!"), Message("user", "Bye.")],
]


def _runner(model: Path, template: Path | None) -> Any:
    import mistralrs

    which = mistralrs.Which.GGUF(quantized_model_id=str(model.parent), quantized_filename=model.name)
    extra = {"jinja_explicit": str(template)} if template is not None else {}
    return mistralrs.Runner(which=which, token_source="none", max_seqs=1, prefix_cache_n=0, **extra)


def _engine_prompt_tokens(runner: Any, messages: list[dict[str, str]]) -> int:
    """``prompt_tokens`` of a chat request the engine renders with its own template."""
    import mistralrs

    request = mistralrs.ChatCompletionRequest(messages=messages, model="default", max_tokens=1, stream=True)
    usage = None
    for chunk in runner.send_chat_completion_request(request):
        usage = chunk.usage or usage
    assert usage is not None
    return int(usage.prompt_tokens)


def _renderer(model: Path, template: str | None = None) -> PromptRenderer:
    meta = read_metadata(model)
    return PromptRenderer(
        template if template is not None else meta.chat_template,
        bos_token=meta.bos_token,
        eos_token=meta.eos_token,
        unk_token=meta.unk_token,
    )


def _as_dicts(messages: list[Message]) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in messages]


def test_werk_renders_what_the_engine_renders_kitchen_sink(tiny_gguf: Path, tmp_path: Path) -> None:
    template = tmp_path / "kitchen.jinja"
    template.write_text(KITCHEN_SINK)
    runner = _runner(tiny_gguf, template)
    renderer = _renderer(tiny_gguf, KITCHEN_SINK)
    for conversation in CONVERSATIONS:
        ours = len(runner.tokenize_text(renderer.render(conversation), False, None))
        assert ours == _engine_prompt_tokens(runner, _as_dicts(conversation))


def test_werk_renders_what_the_engine_renders_smollm2(smollm2_gguf: Path) -> None:
    runner = _runner(smollm2_gguf, None)  # the engine alone, with the GGUF's own template
    renderer = _renderer(smollm2_gguf)
    first, second = CONVERSATIONS
    for conversation in ([Message("user", "Hi.")], second):  # without and with a system message
        ours = len(runner.tokenize_text(renderer.render(conversation), False, None))
        assert ours == _engine_prompt_tokens(runner, _as_dicts(conversation))


def test_a_raw_prompt_costs_its_token_count(tiny_gguf: Path, tmp_path: Path) -> None:
    template = tmp_path / "engine.jinja"
    template.write_text(engine_template(read_metadata(tiny_gguf).chat_template))
    engine = load_engine(tiny_gguf, template, EngineSettings())
    try:
        prompt = "<|im_start|>user\nthe state of the cache<|im_end|>\n"
        stream = engine.open(prompt, Sampling(max_tokens=3, temperature=0.0), RAW_ROLE)
        pieces = []
        while (piece := stream.next()) is not None:
            pieces.append(piece)
        assert stream.usage is not None
        assert stream.usage.prompt_tokens == len(engine.tokenize(prompt))
        assert stream.usage.completion_tokens == 3 and pieces[-1].finish_reason == "length"
        assert engine.max_sequence_length == 4096
    finally:
        engine.close()
    with pytest.raises(EngineFailure):
        engine.tokenize("after close")


def test_a_panic_in_the_engine_is_contained(tiny_gguf: Path) -> None:
    import mistralrs

    runner = _runner(tiny_gguf, None)
    broken = mistralrs.ChatCompletionRequest(messages=[{"role": "user"}], model="default", max_tokens=1, stream=True)
    with pytest.raises(EngineFailure) as caught:
        engine_call("submit", lambda: list(runner.send_chat_completion_request(broken)))
    assert caught.value.detail.startswith("PanicException")
    assert _engine_prompt_tokens(runner, [{"role": "user", "content": "still here"}]) > 0


def test_load_failures_are_engine_failures(tiny_gguf: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[: tiny_gguf.stat().st_size // 2])
    template = tmp_path / "t.jinja"
    template.write_text(engine_template(None))
    with pytest.raises(EngineFailure) as caught:
        load_engine(cut, template, EngineSettings())
    assert caught.value.what == "load"
    gc.collect()
