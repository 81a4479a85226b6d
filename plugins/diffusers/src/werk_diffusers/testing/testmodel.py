"""Write a tiny random-weight Stable Diffusion pipeline in Diffusers format, for tests and benches.

The weights are random (seeded), so the pictures are noise, but it is a real
``StableDiffusionPipeline`` folder (``model_index.json``, ``unet/``, ``vae/``, ``text_encoder/``,
``tokenizer/``, ``scheduler/``): diffusers loads it, and ``AutoPipelineForImage2Image.from_pipe``
turns it into image-to-image. Standalone on purpose (standard library at import time; ``torch``,
``transformers`` and ``diffusers`` inside :func:`write`), so the engine virtualenv runs it by
path, with no network (the tokenizer's vocabulary is generated here, nothing comes from a hub)::

    <venv>/bin/python testmodel.py OUT [--seed N]

* UNet: block_out_channels (32, 64), one layer per block, one cross-attention block down and
  up, sample size 8 (64 px), cross-attention dimension 32;
* VAE: block_out_channels (32, 64), 4 latent channels (scale factor 2);
* text encoder: CLIP, hidden 32, 2 layers, 4 heads, intermediate 37, 77 positions; tokenizer: a
  byte-level BPE of the 256 byte symbols, their ``</w>`` forms and a few merges;
* scheduler: PNDM's default config; no safety checker, no feature extractor; float32 safetensors.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

MERGE_WORDS = ["the", "and", "cat", "dog", "red", "blue", "sky", "tree", "house", "photo"]


def _bytes_to_unicode() -> dict[int, str]:
    """CLIP's (and GPT-2's) byte-to-symbol table."""
    picked = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    picked += list(range(ord("®"), ord("ÿ") + 1))
    symbols = picked[:]
    extra = 0
    for b in range(256):
        if b not in picked:
            picked.append(b)
            symbols.append(256 + extra)
            extra += 1
    return dict(zip(picked, (chr(s) for s in symbols), strict=True))


def write_tokenizer(out: Path) -> None:
    """A ``CLIPTokenizer``'s ``vocab.json`` and ``merges.txt``, generated (no download)."""
    out.mkdir(parents=True, exist_ok=True)
    symbols = list(_bytes_to_unicode().values())
    vocab_list = symbols + [s + "</w>" for s in symbols]
    merges: list[str] = []
    for word in MERGE_WORDS:
        left = word[0]
        for i, ch in enumerate(word[1:], start=1):
            right = ch + "</w>" if i == len(word) - 1 else ch
            merges.append(f"{left} {right}")
            left = left + right
            if left not in vocab_list:
                vocab_list.append(left)
    vocab_list += ["<|startoftext|>", "<|endoftext|>"]
    vocab = {token: i for i, token in enumerate(dict.fromkeys(vocab_list))}
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(dict.fromkeys(merges)) + "\n", encoding="utf-8")


def write(out: Path, seed: int = 0) -> Path:
    torch: Any = importlib.import_module("torch")
    transformers: Any = importlib.import_module("transformers")
    diffusers: Any = importlib.import_module("diffusers")
    transformers.utils.logging.disable_progress_bar()
    out.mkdir(parents=True, exist_ok=True)
    scratch = out / ".tokenizer-src"
    write_tokenizer(scratch)
    tokenizer = transformers.CLIPTokenizer(
        str(scratch / "vocab.json"), str(scratch / "merges.txt"), model_max_length=77
    )
    torch.manual_seed(seed)
    unet = diffusers.UNet2DConditionModel(
        block_out_channels=(32, 64),
        layers_per_block=1,
        sample_size=8,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=32,
    )
    vae = diffusers.AutoencoderKL(
        block_out_channels=(32, 64),
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        latent_channels=4,
        sample_size=64,
        norm_num_groups=32,
    )
    text_config = transformers.CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=77,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        projection_dim=32,
    )
    text_encoder = transformers.CLIPTextModel(text_config)
    scheduler = diffusers.PNDMScheduler(skip_prk_steps=True, steps_offset=1)
    pipe = diffusers.StableDiffusionPipeline(
        unet=unet,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(out, safe_serialization=True)
    for leftover in scratch.iterdir():
        leftover.unlink()
    scratch.rmdir()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="testmodel.py", description="Write a tiny random Stable Diffusion pipeline.")
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(write(args.out, args.seed).resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
