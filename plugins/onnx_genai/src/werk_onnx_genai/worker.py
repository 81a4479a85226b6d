"""The ONNX Runtime GenAI worker: one GenAI model directory behind the kit's small HTTP server
on 127.0.0.1, CPU execution.

Run by path with the engine virtualenv's interpreter (``scripts/setup-engine-venv.sh
onnx-genai`` makes one), never imported by the plugin: the standard library and
``onnxruntime_genai`` only, nothing of Werk. The server itself (key check, loopback, bounded
reads, the routes) is the kit's worker side, ``werk_host/plugin/engine_worker.py``, loaded by the
path the adapter passes as ``--kit``::

    <venv>/bin/python worker.py --kit KIT --model DIR --port P

Contract (docs/onnx-genai.md, "The worker"; docs/plugin-kit.md, "Engine workers"): the key comes
from ``WERK_ONNX_GENAI_WORKER_KEY``; the model and tokenizers load before the port listens;
``/count`` is the tokens of the prompt the chat route feeds the model (the model's chat
template, applied by GenAI's tokenizer, with the generation prompt). Each request gets a **new
generator** and prompt state (the seed's ONNX Runtime Python GenAI row: no prefix reuse); a
client that goes away ends the generation at the next token.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

KEY_ENV = "WERK_ONNX_GENAI_WORKER_KEY"


class Engine:
    """The loaded model and its tokenizers (the kit's ``engine_worker.Engine``)."""

    def __init__(self, model_dir: str) -> None:
        og: Any = importlib.import_module("onnxruntime_genai")
        self.og = og
        self.model = og.Model(model_dir)
        self.tokenizer = og.Tokenizer(self.model)
        self.count_tokenizer = og.Tokenizer(self.model)  # counts never share the generation's
        with open(os.path.join(model_dir, "genai_config.json"), encoding="utf-8") as handle:
            model = json.load(handle)["model"]
        self.context = int(model.get("context_length") or 0)
        eos = model.get("eos_token_id")
        self.eos = {int(i) for i in (eos if isinstance(eos, list) else [eos]) if isinstance(i, int)}

    def prompt_ids(self, messages: list[dict[str, Any]], tools: Any, *, counting: bool = False) -> list[int]:
        tokenizer = self.count_tokenizer if counting else self.tokenizer
        text = tokenizer.apply_chat_template(
            json.dumps(messages), tools=json.dumps(tools) if tools else None, add_generation_prompt=True
        )
        return [int(i) for i in tokenizer.encode(text)]

    def generate(
        self, body: dict[str, Any], ids: list[int], cancelled: threading.Event
    ) -> Iterator[tuple[str, str | None, int]]:
        """Yield ``(text piece, finish_reason or None, completion tokens so far)``; the last item
        carries the finish reason. The caller holds the lock."""
        og = self.og
        limit = body.get("max_tokens") or body.get("max_completion_tokens")
        room = self.context - len(ids) if self.context else 1 << 20
        max_new = max(0, min(int(limit), room) if isinstance(limit, int) else room)
        if max_new == 0:
            yield "", "length", 0
            return
        temperature = body.get("temperature")
        temperature = 1.0 if temperature is None else float(temperature)
        params = og.GeneratorParams(self.model)
        search: dict[str, Any] = {"max_length": len(ids) + max_new}
        if temperature <= 0:
            search.update(do_sample=False)
        else:
            search.update(do_sample=True, temperature=temperature, top_p=float(body.get("top_p") or 1.0), top_k=0)
        params.set_search_options(**search)
        seed = body.get("seed")
        if isinstance(seed, int):
            params.set_search_options(random_seed=seed)
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else [s for s in stops if isinstance(s, str) and s]
        generator = og.Generator(self.model, params)  # a new generator and prompt state per request
        generator.append_tokens(ids)
        stream = self.tokenizer.create_stream()  # GenAI's incremental decoder (whole UTF-8 only)
        produced = 0
        text = ""
        finish = "length"
        while not generator.is_done():
            if cancelled.is_set():
                return
            generator.generate_next_token()
            token = int(generator.get_next_tokens()[0])
            if token in self.eos:
                finish = "stop"
                break
            produced += 1
            piece = str(stream.decode(token))
            text += piece
            hit = next((text.index(s) for s in stops if s in text), None)
            if hit is not None:
                yield piece[: max(0, hit - (len(text) - len(piece)))], "stop", produced
                return
            if piece:
                yield piece, None, produced
        yield "", finish, produced


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
    args = parser.parse_args(argv)
    status: int = _kit(args.kit).run(KEY_ENV, args.port, lambda: Engine(args.model))
    return status


if __name__ == "__main__":
    sys.exit(main())
