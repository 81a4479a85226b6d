"""Write a tiny random-weight BERT encoder checkpoint in Hugging Face format, for the embedding
tests (docs/transformers.md, "Embeddings").

The weights are random (seeded), so its vectors mean nothing, but it is a real ``BertModel``
(``architectures: ["BertModel"]``, no LM head) with a real WordPiece tokenizer: transformers
loads it with ``AutoModel`` and ``AutoTokenizer`` as it loads a sentence-embedding checkpoint.
Standalone on purpose (standard library at import time; ``tokenizers``, ``transformers`` and
``torch`` inside :func:`write`), so the engine virtualenv runs it by path::

    <venv>/bin/python testencoder.py OUT [--seed N]

* tokenizer: lower-casing WordPiece of at most 512 tokens trained on a fixed text (every ASCII
  letter and digit is in its alphabet, so few words become ``[UNK]``); specials ``[PAD]`` 0,
  ``[UNK]`` 1, ``[CLS]`` 2, ``[SEP]`` 3, ``[MASK]`` 4; ``[CLS] text [SEP]``;
  ``model_max_length`` 512;
* model: 2 layers, hidden size 32, 2 heads, intermediate 64, 128 positions (so the inputs'
  bound, the smaller of the two, is 128 tokens), float32 safetensors.
"""

from __future__ import annotations

import argparse
import importlib
import string
import sys
from pathlib import Path
from typing import Any

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TEXT = [
    "Werk serves local language models through one protocol.",
    "Embeddings map text to vectors; similar texts get similar vectors.",
    "The quick brown fox jumps over the lazy dog.",
    "A fourth sentence, different from the others.",
    "Rain falls on the hills and the rivers carry it to the sea.",
    "One, two, three, four, five: 12345 and 67890 are numbers too.",
    string.ascii_lowercase + " " + string.digits + " " + string.punctuation,
]
POSITIONS = 128


def write(out: Path, seed: int = 0) -> Path:
    tokenizers: Any = importlib.import_module("tokenizers")
    transformers: Any = importlib.import_module("transformers")
    torch: Any = importlib.import_module("torch")
    transformers.utils.logging.disable_progress_bar()
    out.mkdir(parents=True, exist_ok=True)
    wordpiece = tokenizers.implementations.BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(TEXT * 20, vocab_size=512, special_tokens=SPECIALS, show_progress=False)
    tokenizer = transformers.BertTokenizerFast(tokenizer_object=wordpiece._tokenizer, model_max_length=512)
    tokenizer.save_pretrained(out)
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=POSITIONS,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    transformers.BertModel(config).save_pretrained(out, safe_serialization=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="testencoder.py", description="Write a tiny random BERT encoder.")
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(write(args.out, args.seed).resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
