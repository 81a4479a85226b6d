"""The worker's model: loading (with or without expert offload) and serialised generation.

:func:`load` builds the mlx-lm model lazily; with a positive ``budget_bytes`` it installs
expert offload (:mod:`werk_omlx.worker.offload`) before any weight is evaluated, so the
expert tensors stay on disk. When the model cannot be offloaded (no MoE blocks, a layout the
reader does not know) it is loaded whole and :attr:`LoadedModel.offload_reason` says why;
offload is *active* only when a store exists. :class:`Engine` renders chat prompts with the
model's own template, runs one generation at a time (mlx-lm's ``stream_generate``) and, with a
:class:`~werk_omlx.worker.prefix.PrefixCache`, reuses the longest exact token prefix of an
earlier request.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.nn.layers.base import Module
from mlx_lm.generate import stream_generate
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_sampler
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import load_model, load_tokenizer

from .offload import ExpertStore, install_offload
from .prefix import PrefixCache
from .tensors import LayoutError, read_index


@dataclass
class LoadedModel:
    model: Module
    tokenizer: TokenizerWrapper
    model_type: str
    store: ExpertStore | None
    #: why offload is not active (``None`` when it is, or was not asked for)
    offload_reason: str | None


def load(model_dir: Path, budget_bytes: int | None) -> LoadedModel:
    """Load ``model_dir``; offload its experts within ``budget_bytes`` when given and possible."""
    model, config = load_model(model_dir, lazy=True)
    tokenizer = load_tokenizer(model_dir)  # type: ignore[no-untyped-call]
    store: ExpertStore | None = None
    reason: str | None = None
    if budget_bytes is not None:
        try:
            store = install_offload(model, read_index(model_dir), budget_bytes)
        except LayoutError as err:
            reason = str(err)
    mx.eval(model.parameters())
    return LoadedModel(model, tokenizer, str(config.get("model_type", "")), store, reason)


@dataclass(frozen=True)
class Sampling:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Piece:
    """Generated text so far: one new ``text`` segment; ``finish_reason`` on the last."""

    text: str
    finish_reason: str | None = None


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


class Engine:
    """One model, one generation at a time (module docstring)."""

    def __init__(self, loaded: LoadedModel, prefix: PrefixCache | None = None) -> None:
        self.loaded = loaded
        self.prefix = prefix
        self.lock = threading.Lock()

    @property
    def tokenizer(self) -> TokenizerWrapper:
        return self.loaded.tokenizer

    def chat_tokens(
        self, messages: list[dict[str, Any]], tools: list[Any] | None, template_kwargs: dict[str, Any]
    ) -> list[int]:
        """The prompt tokens of a chat request, rendered with the model's own template."""
        kwargs = dict(template_kwargs)
        if tools:
            kwargs["tools"] = tools
        render = self.tokenizer.apply_chat_template
        tokens = render(messages, add_generation_prompt=True, tokenize=True, **kwargs)  # type: ignore[no-untyped-call]
        return [int(t) for t in tokens]

    def text_tokens(self, prompt: str) -> list[int]:
        tok = self.tokenizer
        special = tok.bos_token is None or not prompt.startswith(tok.bos_token)
        return [int(t) for t in tok.encode(prompt, add_special_tokens=special)]

    def generate(
        self, prompt: Sequence[int], sampling: Sampling, usage: Usage, cancelled: threading.Event
    ) -> Iterator[Piece]:
        """Stream pieces for ``prompt``; ``usage`` is filled as it goes. Holds :attr:`lock`
        for the whole generation; stops early when ``cancelled`` is set."""
        if not prompt:
            raise ValueError("the prompt is empty")
        with self.lock:
            yield from self._generate(list(prompt), sampling, usage, cancelled)

    def _generate(
        self, prompt: list[int], sampling: Sampling, usage: Usage, cancelled: threading.Event
    ) -> Iterator[Piece]:
        model = self.loaded.model
        usage.prompt_tokens = len(prompt)
        if self.prefix is not None:
            cache, reused = self.prefix.lookup(prompt, lambda: make_prompt_cache(model))
        else:
            cache, reused = make_prompt_cache(model), 0
        usage.cached_tokens = reused
        if sampling.seed is not None:
            mx.random.seed(sampling.seed)
        sampler = make_sampler(temp=sampling.temperature, top_p=sampling.top_p if sampling.top_p < 1.0 else 0.0)
        held = ""
        generated: list[int] = []
        finish = "length"
        longest_stop = max((len(s) for s in sampling.stop), default=0)
        for response in stream_generate(
            model,
            self.tokenizer,
            mx.array(prompt[reused:]),
            max_tokens=sampling.max_tokens,
            sampler=sampler,
            prompt_cache=cache,
        ):
            if cancelled.is_set():
                finish = "cancelled"
                break
            if response.finish_reason != "stop":  # a final "stop" carries the end-of-sequence token
                generated.append(int(response.token))
            usage.completion_tokens = len(generated)
            held += response.text
            stop_at = min((i for i in (held.find(s) for s in sampling.stop) if i >= 0), default=-1)
            if stop_at >= 0:
                held = held[:stop_at]
                finish = "stop"
                break
            if response.finish_reason is not None:
                finish = response.finish_reason
                break
            keep = longest_stop - 1 if longest_stop else 0
            ready, held = (held[: len(held) - keep], held[len(held) - keep :]) if keep else (held, "")
            if ready:
                yield Piece(ready)
        if finish == "cancelled":
            return
        if self.prefix is not None:
            self.prefix.store(prompt + generated, cache)
        yield Piece(held, finish)
