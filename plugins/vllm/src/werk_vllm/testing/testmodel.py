"""Generate a tiny random Llama in Hugging Face format, for vLLM tests and benchmarks.

The model has random (seeded, deterministic) float32 weights, so it emits
nonsense, but it is a real ``LlamaForCausalLM`` for vLLM: it loads, tokenizes,
applies a chat template, prefills, generates and uses the prefix cache.

* Tokenizer: a byte-level BPE (512 tokens) trained on a fixed English corpus,
  so any input round-trips; special tokens ``<unk>`` (0), ``<s>`` (1),
  ``</s>`` (2, end of sequence), ``<|im_start|>`` (3), ``<|im_end|>`` (4).
* A ChatML jinja chat template (saved with the tokenizer).
* Model: 2 layers, hidden 128, 2 attention heads (head_dim 64), no GQA,
  intermediate 256, ``max_position_embeddings`` 2048, float32 safetensors.
* With ``--classifier``: the same model as a ``LlamaForSequenceClassification``
  with one label (a cross-encoder: vLLM's pooling runner serves it as a
  reranker, ``/rerank``), ``pad_token_id`` 0.

The same seed gives byte-identical files.

This module is standalone on purpose: it imports only the standard library at
import time, and ``tokenizers``, ``transformers`` and ``torch`` (all shipped in
the vLLM virtualenv built by ``scripts/setup-vllm.sh``) inside :func:`generate`.
It does not import ``werk_host`` or ``werk_vllm``, so the plugin can run it by
path with the vLLM venv's interpreter::

    <vllm venv>/bin/python /path/to/werk_vllm/testing/testmodel.py OUT [--seed N] [--classifier]

which writes the model directory OUT and prints its absolute path.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["CHATML_TEMPLATE", "SPECIAL_TOKENS", "VOCAB_SIZE", "generate", "main"]

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")
VOCAB_SIZE = 512

_SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Hello, how are you today? I am fine, thank you.",
    "Werk hosts local language models behind one small API.",
    "A tiny model is enough to test loading, tokenizing and generating text.",
    "Once upon a time there was a little cat that liked to sleep in the sun.",
    "What is the capital of France? The capital of France is Paris.",
    "Numbers like 0 1 2 3 4 5 6 7 8 9 10 100 1000 appear in text as well.",
    "Please write a short story about a robot who learns to paint.",
    "She sells sea shells by the sea shore; the shells she sells are surely sea shells.",
    "Good morning! Could you summarize this document in three bullet points?",
    "Rivers flow into the ocean, and clouds carry the water back over the mountains.",
    "Testing, testing: one, two, three. Is this thing on?",
)
_CORPUS = [sentence for _ in range(50) for sentence in _SENTENCES]


def generate(out: Path, *, seed: int = 0, classifier: bool = False) -> Path:
    """Write the tiny model (tokenizer, chat template, config, weights) into ``out``; return ``out``.
    With ``classifier`` it is a one-label ``LlamaForSequenceClassification`` (module docstring)."""
    # A single-threaded trainer keeps the merges independent of the thread count.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tokenizers: Any = importlib.import_module("tokenizers")
    transformers: Any = importlib.import_module("transformers")
    torch: Any = importlib.import_module("torch")

    transformers.utils.logging.disable_progress_bar()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    byte_level = tokenizers.pre_tokenizers.ByteLevel
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = byte_level(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=byte_level.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", model_max_length=2048
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=False,
        dtype="float32",
    )
    if classifier:
        config.num_labels = 1
        config.pad_token_id = 0
        model = transformers.LlamaForSequenceClassification(config)
    else:
        model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="testmodel.py", description="Write a tiny random Llama (Hugging Face format) for vLLM tests."
    )
    parser.add_argument("out", type=Path, help="model directory to write (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default: 0)")
    parser.add_argument("--classifier", action="store_true", help="a one-label sequence classifier (a reranker)")
    args = parser.parse_args(argv)
    path = generate(args.out, seed=args.seed, classifier=args.classifier)
    print(path.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
