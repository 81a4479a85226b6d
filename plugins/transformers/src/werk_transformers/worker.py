"""The transformers worker: one model on torch behind the kit's small HTTP server on 127.0.0.1.

Run by path with the engine virtualenv's interpreter (``scripts/setup-engine-venv.sh
transformers`` makes one), never imported by the plugin: it needs only the standard library,
``torch`` and ``transformers``, and nothing of Werk. The server itself (key check, loopback,
bounded reads, the routes) is the kit's worker side, ``werk_host/plugin/engine_worker.py``,
loaded by the path the adapter passes as ``--kit``::

    <venv>/bin/python worker.py --kit KIT --model DIR --port P [--device cpu] [--dtype auto] [--embed]

Contract (docs/transformers.md, "The worker"; docs/plugin-kit.md, "Engine workers"): the key comes
from ``WERK_TRANSFORMERS_WORKER_KEY``; the model and its tokenizers load before the port listens;
``/count`` is the length of the prompt the chat route feeds the model (the model's own chat
template with the generation prompt, tokenized without extra special tokens), from a tokenizer
of its own; each generation keeps its KV cache only while it runs (the seed's
"generation-local cache") and stops at the next token once its client went away.

With ``--embed`` it is an embedding worker instead (:class:`Encoder`; docs/transformers.md,
"Embeddings"): the base model (``AutoModel``, no LM head), no chat routes, and three JSON routes,
outside the kit's generation lock (an embedding takes a lock of its own, a tokenization the second
tokenizer's):

* ``POST /info`` ``{}``: ``{"dimensions", "hidden_size", "max_input_tokens", "vocab_size"}``;
  ``dimensions`` is the width of a probe vector computed at load, ``hidden_size`` the config's;
* ``POST /embed`` ``{"inputs": [str | [int]], "pooling": "mean" | "cls"}``: ``{"vectors",
  "prompt_tokens"}``, one L2-normalized vector per input, in order: the mean of the last hidden
  state over the real tokens (the attention mask), or its first token's. Strings are tokenized
  with the special tokens, token ids are fed as they are; the batch is right-padded under the
  attention mask, so a vector does not depend on its batch. An input over ``max_input_tokens`` or
  a token id outside the vocabulary is a 400 (the host truncates, never the worker). The pooling
  is per request, so instances of one model with different poolings share the worker;
* ``POST /tokenize`` ``{"text": str}``: ``{"tokens": [int]}``, the ids ``/embed`` feeds for it.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import secrets
import sys
import threading
from collections.abc import Iterator
from typing import Any

KEY_ENV = "WERK_TRANSFORMERS_WORKER_KEY"


class Engine:
    """The loaded model and its tokenizers (the kit's ``engine_worker.Engine``)."""

    def __init__(self, model_dir: str, device: str, dtype: str) -> None:
        torch: Any = importlib.import_module("torch")
        transformers: Any = importlib.import_module("transformers")
        self.torch = torch
        transformers.utils.logging.disable_progress_bar()
        torch_dtype: Any = "auto" if dtype == "auto" else getattr(torch, dtype)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        self.count_tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model.to(device)
        self.model.eval()
        self.device = device
        eos: set[int] = set()
        for source in (self.model.generation_config.eos_token_id, self.tokenizer.eos_token_id):
            if isinstance(source, int):
                eos.add(source)
            elif isinstance(source, list):
                eos.update(i for i in source if isinstance(i, int))
        self.eos = eos

    def prompt_ids(self, messages: list[dict[str, Any]], tools: Any, *, counting: bool = False) -> list[int]:
        tokenizer = self.count_tokenizer if counting else self.tokenizer
        text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids

    def generate(
        self, body: dict[str, Any], ids: list[int], cancelled: threading.Event
    ) -> Iterator[tuple[str, str | None, int]]:
        """Yield ``(text piece, finish_reason or None, completion tokens so far)``; the last item
        has the finish reason. Runs under the generation lock (the caller holds it)."""
        torch = self.torch
        limit = body.get("max_tokens") or body.get("max_completion_tokens")
        context = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)
        room = context - len(ids) if context else 1 << 30
        max_new = min(int(limit), room) if isinstance(limit, int) else room
        temperature = float(body.get("temperature", 1.0) if body.get("temperature") is not None else 1.0)
        top_p = float(body.get("top_p") or 1.0)
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else [s for s in stops if isinstance(s, str) and s]
        generator = torch.Generator(device="cpu")
        seed = body.get("seed")
        generator.manual_seed(int(seed) if isinstance(seed, int) else secrets.randbits(62))
        produced: list[int] = []
        sent = ""
        past = None
        step = torch.tensor([ids], device=self.device)
        finish = "length"
        with torch.inference_mode():
            for _ in range(max(max_new, 0)):
                if cancelled.is_set():
                    return
                out = self.model(input_ids=step, past_key_values=past, use_cache=True)
                past = out.past_key_values
                token = _pick(torch, out.logits[0, -1].float(), temperature, top_p, generator)
                if token in self.eos:
                    finish = "stop"
                    break
                produced.append(token)
                text = str(self.tokenizer.decode(produced, skip_special_tokens=True))
                hit = next((text.index(s) for s in stops if s in text), None)
                if hit is not None:
                    yield text[len(sent) : hit], "stop", len(produced)
                    return
                if not text.endswith("\ufffd") and len(text) > len(sent):
                    yield text[len(sent) :], None, len(produced)
                    sent = text
                step = torch.tensor([[token]], device=self.device)
        text = str(self.tokenizer.decode(produced, skip_special_tokens=True))
        yield text[len(sent) :], finish, len(produced)


#: A tokenizer's ``model_max_length`` above this is transformers' "no limit" sentinel.
SANE_LENGTH = 1 << 20
PROBE = "Werk embedding probe."
POOLINGS = ("mean", "cls")


class Encoder:
    """An embedding worker's model: the base model and two tokenizers (module docstring)."""

    def __init__(self, model_dir: str, device: str, dtype: str) -> None:
        torch: Any = importlib.import_module("torch")
        transformers: Any = importlib.import_module("transformers")
        self.torch = torch
        transformers.utils.logging.disable_progress_bar()
        torch_dtype: Any = "auto" if dtype == "auto" else getattr(torch, dtype)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        self.count_tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        self.model = transformers.AutoModel.from_pretrained(model_dir, dtype=torch_dtype)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model.to(device)
        self.model.eval()
        self.device = device
        self.lock = threading.Lock()
        self.count_lock = threading.Lock()
        config = self.model.config
        self.hidden_size = int(getattr(config, "hidden_size", 0) or 0)
        self.vocab_size = int(getattr(config, "vocab_size", 0) or 0) or len(self.tokenizer)
        bounds = [getattr(config, "max_position_embeddings", None), getattr(self.tokenizer, "model_max_length", None)]
        sane = [int(b) for b in bounds if isinstance(b, int) and not isinstance(b, bool) and 0 < b <= SANE_LENGTH]
        self.max_input_tokens = min(sane) if sane else 512
        pad = self.tokenizer.pad_token_id
        self.pad = int(pad) if isinstance(pad, int) else 0
        self.dimensions = len(self.embed([PROBE])[0][0])

    def ids(self, text: str, tokenizer: Any = None) -> list[int]:
        """The token ids fed for ``text``: the checkpoint's tokenizer, special tokens added."""
        ids: list[int] = (tokenizer or self.tokenizer)(text, add_special_tokens=True)["input_ids"]
        return ids

    def embed(self, inputs: list[Any], pooling: str = "mean") -> tuple[list[list[float]], int]:
        """One L2-normalized vector per input and the tokens fed (module docstring)."""
        torch = self.torch
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}")
        with self.lock:
            batch = [self.ids(x) if isinstance(x, str) else x for x in inputs]
            for ids in batch:
                if not isinstance(ids, list) or not ids or not all(type(t) is int for t in ids):
                    raise ValueError("an input is neither a string nor a non-empty list of token ids")
                if len(ids) > self.max_input_tokens:
                    raise ValueError(f"an input has {len(ids)} tokens; the model takes {self.max_input_tokens}")
                if not all(0 <= t < self.vocab_size for t in ids):
                    raise ValueError(f"a token id is outside the vocabulary of {self.vocab_size}")
            width = max(len(ids) for ids in batch)
            padded = [ids + [self.pad] * (width - len(ids)) for ids in batch]
            masks = [[1] * len(ids) + [0] * (width - len(ids)) for ids in batch]
            with torch.inference_mode():
                input_ids = torch.tensor(padded, dtype=torch.long, device=self.device)
                mask = torch.tensor(masks, dtype=torch.long, device=self.device)
                hidden = self.model(input_ids=input_ids, attention_mask=mask).last_hidden_state.float()
                if pooling == "cls":
                    pooled = hidden[:, 0]
                else:
                    weights = mask.unsqueeze(-1).to(hidden.dtype)
                    pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
                vectors: list[list[float]] = torch.nn.functional.normalize(pooled, p=2, dim=-1).cpu().tolist()
            return vectors, sum(len(ids) for ids in batch)

    def answer(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """The kit's ``answer`` hook: the embedding routes (module docstring)."""
        if path == "/info":
            return {
                "dimensions": self.dimensions,
                "hidden_size": self.hidden_size,
                "max_input_tokens": self.max_input_tokens,
                "vocab_size": self.vocab_size,
            }
        if path == "/embed":
            inputs = body["inputs"]
            if not isinstance(inputs, list) or not inputs:
                raise ValueError("inputs must be a non-empty list")
            vectors, tokens = self.embed(inputs, body.get("pooling", "mean"))
            return {"vectors": vectors, "prompt_tokens": tokens}
        if path == "/tokenize":
            text = body["text"]
            if not isinstance(text, str):
                raise TypeError("text must be a string")
            with self.count_lock:
                return {"tokens": self.ids(text, self.count_tokenizer)}
        return None


def _pick(torch: Any, logits: Any, temperature: float, top_p: float, generator: Any) -> int:
    if temperature <= 0:
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        ordered, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(ordered, dim=-1) - ordered < top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], ordered[keep])
    return int(torch.multinomial(probs, 1, generator=generator).item())


def _kit(path: str) -> Any:
    """The kit's worker side (``werk_host/plugin/engine_worker.py``), by path: no Werk here."""
    spec = importlib.util.spec_from_file_location("werk_engine_worker", path)
    kit = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(kit)  # type: ignore[union-attr]
    return kit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="worker.py")
    parser.add_argument("--kit", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--embed", action="store_true", help="an embedding worker (the base model)")
    args = parser.parse_args(argv)

    def load() -> Engine | Encoder:
        if args.threads > 0:
            importlib.import_module("torch").set_num_threads(args.threads)
        if args.embed:
            return Encoder(args.model, args.device, args.dtype)
        return Engine(args.model, args.device, args.dtype)

    status: int = _kit(args.kit).run(KEY_ENV, args.port, load)
    return status


if __name__ == "__main__":
    sys.exit(main())
