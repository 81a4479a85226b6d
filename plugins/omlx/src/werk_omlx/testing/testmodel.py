"""Generate small random-weight ``qwen3_moe`` MLX checkpoints (tests, demos and the bench).

``python -m werk_omlx.testing.testmodel OUT [--preset tiny|mid] [--bits 4] [--seed N]`` writes a model
directory mlx-lm loads offline:

* ``config.json``: ``model_type: qwen3_moe`` with every layer sparse (``decoder_sparse_step``
  1), ``torch_dtype: float32`` (on CPU, MLX's ``gather_mm`` needs float32 or quantized weights);
* ``model.safetensors``: float32 weights saved with ``mx.save_safetensors`` in the per-expert
  Hugging Face layout (``model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight``), which
  mlx-lm stacks when it loads;
* a byte-level BPE tokenizer trained here with ``tokenizers`` on a built-in text, with the
  ChatML template and ``<|im_end|>`` as end of sequence.

With ``bits`` the float32 checkpoint is converted by mlx-lm's own ``convert`` (affine, group 64),
which writes the stacked layout real MLX models use (``…mlp.switch_mlp.{gate,up,down}_proj.
{weight,scales,biases}``). Weights are random: output is deterministic for a seed, not sensible.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CORPUS = (
    "Werk hosts local language models. Experts of a mixture live on disk until a router picks them; "
    "a bounded cache keeps the hot ones in memory and evicts the cold ones. "
    "The quick brown fox jumps over the lazy dog. 0123456789 user assistant system\n"
)


@dataclass(frozen=True)
class MoeShape:
    """The dimensions of a generated ``qwen3_moe`` model."""

    layers: int
    hidden: int
    experts: int
    top_k: int
    moe_intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    def expert_bytes(self, bytes_per_weight: int = 4) -> int:
        """Bytes of one float32 expert (gate, up and down projections)."""
        return 3 * self.hidden * self.moe_intermediate * bytes_per_weight


#: The test fixture: 4 layers × 8 experts of 384 KiB (float32), 12 MiB of experts in all.
TINY = MoeShape(
    layers=4, hidden=128, experts=8, top_k=2, moe_intermediate=256, heads=4, kv_heads=2, head_dim=32, vocab=384
)
#: The bench model: 8 layers × 16 experts of 3 MiB (float32), 384 MiB of experts in all.
MID = MoeShape(
    layers=8, hidden=512, experts=16, top_k=2, moe_intermediate=512, heads=8, kv_heads=4, head_dim=64, vocab=512
)
PRESETS = {"tiny": TINY, "mid": MID}


def config_json(shape: MoeShape) -> dict[str, object]:
    """The Hugging Face ``config.json`` of ``shape``."""
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": shape.hidden,
        "num_hidden_layers": shape.layers,
        "intermediate_size": shape.moe_intermediate * 2,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "num_experts": shape.experts,
        "num_experts_per_tok": shape.top_k,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "moe_intermediate_size": shape.moe_intermediate,
        "rms_norm_eps": 1e-6,
        "vocab_size": shape.vocab,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "max_position_embeddings": 2048,
        "norm_topk_prob": True,
        "torch_dtype": "float32",
        "bos_token_id": None,
        "eos_token_id": 2,
        "werk_testmodel": asdict(shape),
    }


def write_tokenizer(out: Path, vocab: int) -> None:
    """A byte-level BPE tokenizer of ``vocab`` entries (specials first: ids 0, 1, 2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([CORPUS] * 4, trainer=trainer)
    tokenizer.save(str(out / "tokenizer.json"))
    settings = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "chat_template": CHATML,
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(settings, indent=1))


def write_weights(out: Path, shape: MoeShape, seed: int) -> None:
    """Random float32 weights in the per-expert Hugging Face layout."""
    import mlx.core as mx

    key = mx.random.key(seed)
    weights: dict[str, mx.array] = {}

    def normal(name: str, *dims: int, scale: float = 0.05) -> None:
        nonlocal key
        key, sub = mx.random.split(key)
        weights[name] = mx.random.normal(dims, dtype=mx.float32, key=sub) * scale

    h, s = shape.hidden, shape
    normal("model.embed_tokens.weight", s.vocab, h, scale=0.5)
    normal("lm_head.weight", s.vocab, h, scale=0.5)
    weights["model.norm.weight"] = mx.ones((h,), dtype=mx.float32)
    for layer in range(s.layers):
        p = f"model.layers.{layer}"
        normal(f"{p}.self_attn.q_proj.weight", s.heads * s.head_dim, h)
        normal(f"{p}.self_attn.k_proj.weight", s.kv_heads * s.head_dim, h)
        normal(f"{p}.self_attn.v_proj.weight", s.kv_heads * s.head_dim, h)
        normal(f"{p}.self_attn.o_proj.weight", h, s.heads * s.head_dim)
        weights[f"{p}.self_attn.q_norm.weight"] = mx.ones((s.head_dim,), dtype=mx.float32)
        weights[f"{p}.self_attn.k_norm.weight"] = mx.ones((s.head_dim,), dtype=mx.float32)
        weights[f"{p}.input_layernorm.weight"] = mx.ones((h,), dtype=mx.float32)
        weights[f"{p}.post_attention_layernorm.weight"] = mx.ones((h,), dtype=mx.float32)
        normal(f"{p}.mlp.gate.weight", s.experts, h, scale=0.5)
        for e in range(s.experts):
            normal(f"{p}.mlp.experts.{e}.gate_proj.weight", s.moe_intermediate, h)
            normal(f"{p}.mlp.experts.{e}.up_proj.weight", s.moe_intermediate, h)
            normal(f"{p}.mlp.experts.{e}.down_proj.weight", h, s.moe_intermediate)
        mx.eval(list(weights.values()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})


def generate(out: Path, shape: MoeShape = TINY, *, seed: int = 0, bits: int | None = None) -> Path:
    """Write a model of ``shape`` to ``out`` (which must not exist) and return ``out``.

    ``bits`` (e.g. 4) quantizes it with ``mlx_lm.convert`` (affine, group size 64)."""
    if out.exists():
        raise FileExistsError(out)
    if bits is None:
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps(config_json(shape), indent=1))
        write_tokenizer(out, shape.vocab)
        write_weights(out, shape, seed)
        return out
    from mlx_lm import convert

    with tempfile.TemporaryDirectory(prefix="werk-omlx-testmodel-") as tmp:
        source = generate(Path(tmp) / "f32", shape, seed=seed)
        out.parent.mkdir(parents=True, exist_ok=True)
        convert(str(source), str(out), quantize=True, q_bits=bits, q_group_size=64)
    for stray in ("README.md",):
        (out / stray).unlink(missing_ok=True)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m werk_omlx.testing.testmodel", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--bits", type=int, choices=(4, 8), default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")
    args = parser.parse_args(argv)
    if args.force and args.out.exists():
        shutil.rmtree(args.out)
    print(generate(args.out, PRESETS[args.preset], seed=args.seed, bits=args.bits))


if __name__ == "__main__":
    main()
