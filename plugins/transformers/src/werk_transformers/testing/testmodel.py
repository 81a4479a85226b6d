"""Write a tiny random-weight Llama checkpoint in Hugging Face format, for tests and benches.

The weights are random (seeded), so the model talks nonsense, but it is a real
``LlamaForCausalLM``: transformers loads it, ``onnxruntime_genai.models.builder`` converts it and
vLLM serves it. Standalone on purpose (standard library at import time; ``tokenizers``,
``transformers`` and ``torch`` inside :func:`write`), so the engine virtualenv runs it by path::

    <venv>/bin/python testmodel.py OUT [--seed N]

* tokenizer: byte-level BPE of 384 tokens trained on a fixed text, so every input round-trips;
  specials ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2 (end of sequence), ``<|im_start|>`` 3,
  ``<|im_end|>`` 4; a ChatML chat template;
* model: 2 layers, hidden size 128, 4 heads of 32 (a head size vLLM's CPU kernels take), 2
  key/value heads (grouped-query attention),
  intermediate 128, 1,024 positions, float32 safetensors.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
TEXT = [
    "Werk serves local language models through one protocol.",
    "The tiny model knows nothing, but it loads, counts and generates like a large one.",
    "Rain falls on the hills and the rivers carry it to the sea.",
    "Say hello to the assistant; the assistant says hello back.",
    "One, two, three, four, five: 12345 and 67890 are numbers too.",
    "A quiet library keeps old books, new books and maps of far places.",
]


def write(out: Path, seed: int = 0) -> Path:
    tokenizers: Any = importlib.import_module("tokenizers")
    transformers: Any = importlib.import_module("transformers")
    torch: Any = importlib.import_module("torch")
    transformers.utils.logging.disable_progress_bar()
    out.mkdir(parents=True, exist_ok=True)
    level = tokenizers.pre_tokenizers.ByteLevel
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = level(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=384, special_tokens=SPECIALS, initial_alphabet=level.alphabet(), show_progress=False
    )
    bpe.train_from_iterator(TEXT * 40, trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", unk_token="<unk>", model_max_length=1024
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        dtype="float32",
    )
    transformers.LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="testmodel.py", description="Write a tiny random Llama checkpoint.")
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(write(args.out, args.seed).resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
