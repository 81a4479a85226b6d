"""Generate a tiny llama-architecture GGUF for tests and benchmarks.

The model has random (seeded, deterministic) F32 weights, so it emits nonsense,
but it is a real model for llama.cpp: it loads, tokenizes, prefills, generates
and its slot KV state can be saved and restored.

Tokenizer: a generated SentencePiece-style ("llama") vocabulary with byte
fallback, so tokenization is real and any input round-trips:

* ``<unk>`` (0), ``<s>`` (1), ``</s>`` (2)
* the ChatML control tokens ``<|im_start|>`` and ``<|im_end|>``
* 256 byte tokens ``<0x00>`` .. ``<0xFF>``
* the word-boundary marker ``▁`` and every printable ASCII character
* a list of English word pieces, each with all of its prefixes, so that the
  SPM bigram merge can reach the whole word; longer pieces score higher.

A ChatML jinja chat template is embedded as ``tokenizer.chat_template``. With
``thinking=True`` (``--thinking``) the template is :data:`THINKING_TEMPLATE` instead, a
Qwen3-style ChatML template with a thinking switch (the ``enable_thinking`` variable: ``false``
renders an empty ``<think></think>`` block after the generation prompt), and the vocabulary also
holds ``<think>`` and ``</think>`` as single user-defined tokens, as Qwen3's does.

Mixture of experts: with ``experts=N`` (``--experts N``, N ≥ 2) every layer's dense feed-forward
(``ffn_gate``/``ffn_up``/``ffn_down``) is replaced by a Mixtral-style MoE block: a router
``blk.i.ffn_gate_inp.weight`` (ggml ``[dim, N]``) and the stacked 3-D expert tensors
``blk.i.ffn_gate_exps.weight``/``ffn_up_exps.weight`` (``[dim, ffn, N]``) and
``ffn_down_exps.weight`` (``[ffn, dim, N]``); the header gains ``llama.expert_count`` and
``llama.expert_used_count`` (``experts_used``, ``--experts-used K``, default 2, at most N).
llama-server loads it as a llama MoE model and routes each token to K experts; ``--cpu-moe``
and ``--n-cpu-moe`` select its ``*_exps`` tensors. ``experts=0`` (the default) writes the dense
model, byte-identical to what it always was.

Embeddings: ``--embedding`` writes ``llama.pooling_type`` = mean, ``--reranker`` rank; llama-server
serves such a file with ``--embeddings`` (``/v1/embeddings``) or ``--reranking`` (``/v1/rerank``:
the score is the rank pooling of the last hidden state, there being no classifier head), and Werk
starts it as an embedding or reranking instance from that metadata (werk_llamacpp/embeddings.py).

CLI::

    python -m werk_llamacpp.testing.testmodel OUT.gguf [--dim 64] [--layers 2] [--heads 4]
        [--kv-heads N] [--ffn N] [--ctx 4096] [--seed 0] [--thinking]
        [--experts N [--experts-used K]] [--embedding | --reranker]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import gguf
import numpy as np

__all__ = [
    "CHATML_TEMPLATE",
    "THINKING_TEMPLATE",
    "THINK_START",
    "THINK_END",
    "BOS_ID",
    "EOS_ID",
    "UNK_ID",
    "IM_START",
    "IM_END",
    "build_vocab",
    "generate_model",
    "main",
]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

THINK_START = "<think>"
THINK_END = "</think>"

#: Qwen3's chat template reduced to system/user/assistant turns (no tools): an assistant turn
#: after the last user message carries its reasoning in ``<think>`` tags, and
#: ``enable_thinking=false`` closes an empty thinking block in the generation prompt.
THINKING_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or message.role == 'system' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set reasoning_content = '' %}"
    "{%- if message.reasoning_content is defined and message.reasoning_content is not none %}"
    "{%- set reasoning_content = message.reasoning_content %}"
    "{%- endif %}"
    "{%- if loop.last or reasoning_content %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n'"
    " + message.content.lstrip('\\n') }}"
    "{%- else %}"
    "{{- '<|im_start|>assistant\\n' + message.content }}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

UNK_ID = 0
BOS_ID = 1
EOS_ID = 2
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

_SPACE = "\u2581"  # SentencePiece word-boundary marker

_WORD_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there been one all we their has would when if so no will more can about out up "
    "them some could what into other time only new these two may first then do any like my now over such "
    "our man me even most made after also did many before must through back years where much your way well "
    "down should because each just those people how too little state good very make world still own see men "
    "work long here get both between life being under never day same another know while last might us great "
    "old year off come since against go came right used take three hello prompt model token cache state "
    "slot save restore prefill decode werk llama server system user assistant message content answer question"
)
_WORDS = tuple(_WORD_TEXT.split())


def build_vocab(*, thinking: bool = False) -> tuple[list[str], list[float], list[int]]:
    """Return ``(tokens, scores, token_types)`` of the generated SPM vocabulary; ``thinking``
    adds :data:`THINK_START` and :data:`THINK_END` as user-defined tokens (after ChatML's)."""
    tokens: list[str] = []
    scores: list[float] = []
    types: list[int] = []
    seen: set[str] = set()

    def add(text: str, score: float, ttype: gguf.TokenType) -> None:
        if text in seen:
            return
        seen.add(text)
        tokens.append(text)
        scores.append(score)
        types.append(int(ttype))

    add("<unk>", 0.0, gguf.TokenType.UNKNOWN)
    add("<s>", 0.0, gguf.TokenType.CONTROL)
    add("</s>", 0.0, gguf.TokenType.CONTROL)
    add(IM_START, 0.0, gguf.TokenType.CONTROL)
    add(IM_END, 0.0, gguf.TokenType.CONTROL)
    if thinking:
        add(THINK_START, 0.0, gguf.TokenType.USER_DEFINED)
        add(THINK_END, 0.0, gguf.TokenType.USER_DEFINED)
    for b in range(256):
        add(f"<0x{b:02X}>", 0.0, gguf.TokenType.BYTE)
    # Single characters: the SPM merge starts from these.
    add(_SPACE, -1000.0, gguf.TokenType.NORMAL)
    for c in range(0x21, 0x7F):
        add(chr(c), -1000.0 - c, gguf.TokenType.NORMAL)
    # Word pieces with every prefix so bigram merges can build whole words.
    pieces: list[str] = []
    for word in _WORDS:
        full = _SPACE + word
        for end in range(2, len(full) + 1):
            pieces.append(full[:end])
        for end in range(2, len(word) + 1):
            pieces.append(word[:end])
    for piece in sorted(set(pieces), key=lambda p: (len(p), p)):
        # Longer pieces get higher scores, so whole words win merges.
        add(piece, -100.0 + 10.0 * len(piece), gguf.TokenType.NORMAL)
    return tokens, scores, types


#: ``--embedding`` and ``--reranker``: the GGUF pooling type each writes.
POOLING: dict[str, gguf.PoolingType] = {"mean": gguf.PoolingType.MEAN, "rank": gguf.PoolingType.RANK}


def generate_model(
    path: str | Path,
    *,
    dim: int = 64,
    layers: int = 2,
    heads: int = 4,
    ctx: int = 4096,
    seed: int = 0,
    kv_heads: int | None = None,
    ffn: int | None = None,
    thinking: bool = False,
    experts: int = 0,
    experts_used: int = 2,
    pooling: str | None = None,
) -> Path:
    """Write a tiny random-weight llama GGUF to ``path`` and return the path.

    ``dim`` must be divisible by ``heads`` and ``heads`` by ``kv_heads``
    (default: ``heads``). ``ffn`` defaults to ``4 * dim``. ``thinking`` embeds
    :data:`THINKING_TEMPLATE` and adds the thinking tags to the vocabulary (module
    docstring). ``experts`` (0, or at least 2) makes every layer's feed-forward a mixture of
    that many experts, ``experts_used`` of them per token (module docstring). ``pooling``
    (``mean`` or ``rank``, :data:`POOLING`) writes ``<arch>.pooling_type``: llama.cpp then serves
    the file as an embedding model or a reranker (werk_llamacpp/embeddings.py). The same
    arguments always produce a byte-identical file.
    """
    kv = heads if kv_heads is None else kv_heads
    ff = 4 * dim if ffn is None else ffn
    if dim <= 0 or layers <= 0 or heads <= 0 or kv <= 0 or ff <= 0 or ctx <= 0:
        raise ValueError("dim, layers, heads, kv_heads, ffn and ctx must be positive")
    if dim % heads or heads % kv:
        raise ValueError("dim must be divisible by heads, and heads by kv_heads")
    head_dim = dim // heads
    if head_dim % 2:
        raise ValueError("head dimension (dim / heads) must be even for RoPE")
    if experts < 0 or experts == 1 or (experts and not 1 <= experts_used <= experts):
        raise ValueError("experts must be 0 or at least 2, and experts_used between 1 and experts")

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tokens, scores, types = build_vocab(thinking=thinking)
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int) -> np.ndarray:
        # numpy (rows, cols) becomes ggml ne = [cols, rows]: cols is the input dim.
        return (rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(0.02)).astype(np.float32)

    def stack(n: int, rows: int, cols: int) -> np.ndarray:
        # numpy (n, rows, cols) becomes ggml ne = [cols, rows, n]: one (rows, cols) matrix per expert.
        return (rng.standard_normal((n, rows, cols), dtype=np.float32) * np.float32(0.02)).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    tmp = out.with_name(out.name + ".tmp")
    writer = gguf.GGUFWriter(str(tmp), arch="llama")
    try:
        writer.add_name(f"werk-test-llama-{dim}d-{layers}l" + (f"-{experts}x" if experts else ""))
        writer.add_context_length(ctx)
        writer.add_embedding_length(dim)
        writer.add_block_count(layers)
        writer.add_feed_forward_length(ff)
        if experts:
            writer.add_expert_count(experts)
            writer.add_expert_used_count(experts_used)
        writer.add_head_count(heads)
        writer.add_head_count_kv(kv)
        writer.add_rope_dimension_count(head_dim)
        writer.add_rope_freq_base(10000.0)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_vocab_size(n_vocab)
        writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
        if pooling is not None:
            writer.add_pooling_type(POOLING[pooling])

        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        writer.add_unk_token_id(UNK_ID)
        writer.add_bos_token_id(BOS_ID)
        writer.add_eos_token_id(EOS_ID)
        writer.add_add_bos_token(True)
        writer.add_add_eos_token(False)
        writer.add_chat_template(THINKING_TEMPLATE if thinking else CHATML_TEMPLATE)

        writer.add_tensor("token_embd.weight", mat(n_vocab, dim))
        for i in range(layers):
            writer.add_tensor(f"blk.{i}.attn_norm.weight", ones(dim))
            writer.add_tensor(f"blk.{i}.attn_q.weight", mat(heads * head_dim, dim))
            writer.add_tensor(f"blk.{i}.attn_k.weight", mat(kv * head_dim, dim))
            writer.add_tensor(f"blk.{i}.attn_v.weight", mat(kv * head_dim, dim))
            writer.add_tensor(f"blk.{i}.attn_output.weight", mat(dim, heads * head_dim))
            writer.add_tensor(f"blk.{i}.ffn_norm.weight", ones(dim))
            if experts:
                writer.add_tensor(f"blk.{i}.ffn_gate_inp.weight", mat(experts, dim))
                writer.add_tensor(f"blk.{i}.ffn_gate_exps.weight", stack(experts, ff, dim))
                writer.add_tensor(f"blk.{i}.ffn_up_exps.weight", stack(experts, ff, dim))
                writer.add_tensor(f"blk.{i}.ffn_down_exps.weight", stack(experts, dim, ff))
            else:
                writer.add_tensor(f"blk.{i}.ffn_gate.weight", mat(ff, dim))
                writer.add_tensor(f"blk.{i}.ffn_up.weight", mat(ff, dim))
                writer.add_tensor(f"blk.{i}.ffn_down.weight", mat(dim, ff))
        writer.add_tensor("output_norm.weight", ones(dim))
        writer.add_tensor("output.weight", mat(n_vocab, dim))

        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    tmp.replace(out)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m werk_llamacpp.testing.testmodel",
        description="Generate a tiny random-weight llama GGUF with a real byte-fallback tokenizer.",
    )
    parser.add_argument("out", type=Path, help="output .gguf path")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=None)
    parser.add_argument("--ffn", type=int, default=None, help="feed-forward width (default 4*dim)")
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--thinking", action="store_true", help="Qwen3-style template with a thinking switch")
    parser.add_argument("--experts", type=int, default=0, help="experts per layer (MoE; default 0: dense)")
    parser.add_argument("--experts-used", type=int, default=2, help="experts routed per token (default 2)")
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--embedding", action="store_true", help="an embedding model: mean pooling in its metadata")
    kind.add_argument("--reranker", action="store_true", help="a reranker: rank pooling in its metadata")
    ns = parser.parse_args(argv)
    try:
        out = generate_model(
            ns.out,
            dim=ns.dim,
            layers=ns.layers,
            heads=ns.heads,
            ctx=ns.ctx,
            seed=ns.seed,
            kv_heads=ns.kv_heads,
            ffn=ns.ffn,
            thinking=ns.thinking,
            experts=ns.experts,
            experts_used=ns.experts_used,
            pooling="mean" if ns.embedding else "rank" if ns.reranker else None,
        )
    except ValueError as exc:
        parser.error(str(exc))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
