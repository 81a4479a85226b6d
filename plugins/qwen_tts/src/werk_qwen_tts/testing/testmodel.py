"""Write a tiny, random-weight Qwen3-TTS (12 Hz tokenizer) model folder, for tests and benches.

``qwen_tts.Qwen3TTSModel.from_pretrained(OUT, dtype=torch.float32)`` loads it fully offline, and
``generate_custom_voice`` / ``generate_voice_design`` speak with it (noise, but real audio through
the package's own code). Runs in the engine virtualenv (``scripts/setup-engine-venv.sh qwen-tts``),
which has no Werk: it imports nothing of ``werk_host``, only the standard library at import time
and ``torch``, ``transformers`` and ``qwen_tts`` inside :func:`write`::

    PYTHONPATH=plugins/qwen_tts/src <venv>/bin/python -m werk_qwen_tts.testing.testmodel OUT \\
        [--type=custom_voice|voice_design|base] [--seed N]

(or by path: ``<venv>/bin/python .../testing/testmodel.py OUT ...``; or from Werk's own
environment, where ``werk_qwen_tts`` is installed and torch is not, ``python -m
werk_qwen_tts.testing.testmodel OUT``, which runs itself by path in the engine interpreter that
``WERK_QWEN_TTS_PYTHON`` names). OUT is replaced. Contract:

* files: ``config.json``, ``model.safetensors``, ``generation_config.json`` (the package's
  ``Qwen3TTSConfig`` / ``Qwen3TTSForConditionalGeneration``); a byte-level BPE
  ``Qwen2TokenizerFast`` (``vocab.json``, ``merges.txt``, ``tokenizer.json`` ...); and
  ``speech_tokenizer/`` (``Qwen3TTSTokenizerV2Config`` / ``Model`` + ``EncodecFeatureExtractor``);
* ``tts_model_type`` is ``--type`` (default ``custom_voice``), ``tts_model_size`` ``"tiny"``;
  speakers ``alice`` and ``bob`` (custom_voice only; the others have none), languages
  ``english`` and ``chinese`` (the package adds ``auto``); 24 kHz output, 1,920 samples a frame;
* deterministic: the same ``--seed`` writes the same weights, so the same synthesis seed gives
  the same samples;
* the *length rule*: a handful of hand-set talker weights (:func:`install_length_rule`) make it
  emit codec-EOS after about one frame per text token, so the audio's duration grows with the
  input text (everything else is random, and random weights alone would stop at a seed-dependent
  step whatever the text).

One summary line goes to stderr; nothing to stdout.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

TYPES = ("custom_voice", "voice_design", "base")
SAMPLE_RATE = 24000
FRAME_SAMPLES = 1920  # 12.5 Hz codec frames at 24 kHz (8*5*4*3 * 2*2)
CODEBOOK = 32  # codec entries per codebook (a power of 2: the Mimi encoder requires it)
N_Q = 4  # codebooks per frame == the talker's num_code_groups
TALKER_VOCAB = CODEBOOK + 1024  # the package suppresses ids [vocab-1024, vocab) except EOS
#: Codec special ids, in the suppressed top-1024 block as in the real model.
CODEC = {
    "codec_pad_id": CODEBOOK + 0,
    "codec_bos_id": CODEBOOK + 1,
    "codec_eos_token_id": CODEBOOK + 2,
    "codec_think_id": CODEBOOK + 3,
    "codec_nothink_id": CODEBOOK + 4,
    "codec_think_bos_id": CODEBOOK + 5,
    "codec_think_eos_id": CODEBOOK + 6,
}
LANGUAGES = {"english": CODEBOOK + 16, "chinese": CODEBOOK + 17}
SPEAKERS = {"alice": CODEBOOK + 32, "bob": CODEBOOK + 33}
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|tts_pad|>", "<|tts_text_bos|>", "<|tts_text_eod|>"]
#: Role words must be single tokens: the package slices prompt ids as [:3] and [3:-5].
WORDS = ["assistant", "user", "system"]


def _qwen_tts() -> None:
    """Import ``qwen_tts`` the way the worker does (its stand-in for torchaudio's kaldi module)."""
    spec = importlib.util.spec_from_file_location("werk_qwen_tts_worker", Path(__file__).parents[1] / "worker.py")
    worker = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = worker  # type: ignore[union-attr]  # (its dataclasses look themselves up)
    spec.loader.exec_module(worker)  # type: ignore[union-attr]
    worker.import_qwen_tts()


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-to-printable-character table (what byte-level BPE vocabularies spell)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs], strict=True))


def build_text_tokenizer(tmp: Path) -> tuple[Any, dict[str, int]]:
    """A byte-level BPE ``Qwen2TokenizerFast``: the 256 bytes, merges that make :data:`WORDS`
    single tokens, then :data:`SPECIAL_TOKENS` (ids in that order). Also their ids."""
    transformers: Any = importlib.import_module("transformers")
    b2u = _bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    merges: list[tuple[str, str]] = []
    for word in WORDS:
        cur = word[0]
        for ch in word[1:]:
            merges.append((cur, ch))
            cur += ch
            vocab.setdefault(cur, len(vocab))
    vocab_file, merges_file = tmp / "vocab.json", tmp / "merges.txt"
    vocab_file.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    merges_file.write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    tok = transformers.Qwen2TokenizerFast(
        vocab_file=str(vocab_file),
        merges_file=str(merges_file),
        unk_token=None,
        bos_token=None,
        eos_token=None,
        pad_token=None,
        errors="replace",
        add_prefix_space=False,
        model_max_length=32768,
    )
    tok.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    tok.add_special_tokens({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
    ids = {t: int(tok.convert_tokens_to_ids(t)) for t in SPECIAL_TOKENS}
    # the role prefix / suffix token counts the package relies on
    assert len(tok("<|im_start|>assistant\n")["input_ids"]) == 3
    assert len(tok("<|im_end|>\n<|im_start|>assistant\n")["input_ids"]) == 5
    return tok, ids


def talker_config(text_vocab: int, tts_type: str) -> dict[str, Any]:
    """The talker: 1 layer, hidden 32; 3-D (multimodal) rope, sum(mrope_section) == head_dim / 2."""
    named = tts_type == "custom_voice"  # named speakers exist only in CustomVoice models
    return {
        "vocab_size": TALKER_VOCAB,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000,
        "rope_scaling": {"rope_type": "default", "mrope_section": [4, 2, 2], "interleaved": True},
        "num_code_groups": N_Q,
        "text_hidden_size": 32,
        "text_vocab_size": text_vocab,
        "spk_id": SPEAKERS if named else {},  # the package needs dicts, not None
        "spk_is_dialect": dict.fromkeys(SPEAKERS, False) if named else {},
        "codec_language_id": LANGUAGES,
        "code_predictor_config": {
            "vocab_size": CODEBOOK,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "max_position_embeddings": 64,
            "num_code_groups": N_Q,
        },
        **CODEC,
    }


def speech_tokenizer_config() -> Any:
    """The 12 Hz codec: a tiny Mimi encoder (used only to encode reference audio, voice clone) and
    the package's decoder (codes to a 24 kHz waveform, 1,920 samples a frame)."""
    config: Any = importlib.import_module("qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2")
    return config.Qwen3TTSTokenizerV2Config(
        encoder_config={
            "sampling_rate": SAMPLE_RATE,
            "frame_rate": 12.5,
            "hidden_size": 16,
            "num_filters": 2,
            "num_residual_layers": 1,
            "upsampling_ratios": [8, 6, 5, 4],
            "codebook_size": CODEBOOK,
            "codebook_dim": 16,
            "vector_quantization_hidden_dimension": 16,
            "num_quantizers": N_Q,
            "num_semantic_quantizers": 1,
            "upsample_groups": 16,
            "num_hidden_layers": 1,
            "intermediate_size": 32,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "sliding_window": 250,
            "use_cache": False,
        },
        decoder_config={
            "codebook_size": CODEBOOK,
            "codebook_dim": 16,
            "hidden_size": 16,
            "latent_dim": 16,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_quantizers": N_Q,
            "sliding_window": 72,
            "upsample_rates": [8, 5, 4, 3],
            "upsampling_ratios": [2, 2],
            "decoder_dim": 32,
            "max_position_embeddings": 8000,
        },
        encoder_valid_num_quantizers=N_Q,
        input_sample_rate=SAMPLE_RATE,
        output_sample_rate=SAMPLE_RATE,
        decode_upsample_rate=FRAME_SAMPLES,
        encode_downsample_rate=FRAME_SAMPLES,
    )


def install_length_rule(model: Any, n_plain_text_tokens: int, tts_eos_id: int) -> None:
    """Hand-set a few talker weights so that it emits codec-EOS once it has produced about one
    frame per text token, in both of the package's text-feeding modes.

    Residual-stream dims 0..4 of the talker are reserved (everything else stays random):
      0: marker, nonzero only in tts_eos's text projection;
      1: constant 1 in every codec embedding;
      2: 1 in the text projection of every ordinary (non-special) text token;
      3: 1 in the codec embedding of every real code (ids < CODEBOOK);
      4: written only by attention head 0, whose query is zero, so it attends uniformly and
         outputs mean(dim3 - dim2) over the context, i.e. (frames - text tokens) / L.
    The EOS row of the codec head reads 3000*dim0 - 30*dim1 + 3000*dim4: streaming
    (``non_streaming_mode=False``) text tokens arrive one per frame and tts_eos after the last,
    so EOS comes exactly then (frames == text tokens); non-streaming (all text in the prompt,
    what the worker uses) EOS comes once frames exceed the text tokens by about 3.
    """
    torch: Any = importlib.import_module("torch")
    t = model.talker
    r = slice(0, 5)
    with torch.no_grad():
        emb = t.model.text_embedding.weight  # [text_vocab, H]
        emb[:, 0] = 0.0
        emb[:, 2] = 0.0
        emb[tts_eos_id, 0] = 1.0
        emb[:n_plain_text_tokens, 2] = 1.0
        fc1, fc2 = t.text_projection.linear_fc1, t.text_projection.linear_fc2
        fc1.weight[0:2, :] = 0.0
        fc1.bias[0:2] = 0.0
        fc1.weight[:, 0] = 0.0
        fc1.weight[:, 2] = 0.0
        fc1.weight[0, 0] = 20.0  # hidden 0 <- marker (silu(20) ~= 20)
        fc1.weight[1, 2] = 20.0  # hidden 1 <- plain text
        fc2.weight[r, :] = 0.0
        fc2.bias[r] = 0.0
        fc2.weight[:, 0:2] = 0.0
        fc2.weight[0, 0] = 1.0  # dim0 = 20 for tts_eos
        fc2.weight[2, 1] = 0.05  # dim2 = 1 for plain text
        ce = t.model.codec_embedding.weight
        ce[:, r] = 0.0
        ce[:, 1] = 1.0
        ce[:CODEBOOK, 3] = 1.0
        for e in t.code_predictor.model.codec_embedding:  # groups 1.. are summed into the stream
            e.weight[:, r] = 0.0
        hd = t.config.head_dim
        for i, layer in enumerate(t.model.layers):
            layer.self_attn.o_proj.weight[r, :] = 0.0
            layer.mlp.down_proj.weight[r, :] = 0.0
            if i == 0:
                layer.self_attn.q_proj.weight[0:hd, :] = 0.0  # head 0: uniform attention
                v = layer.self_attn.v_proj.weight
                v[0, :] = 0.0
                v[0, 3] = 1.0
                v[0, 2] = -1.0  # value 0 = dim3 - dim2
                layer.self_attn.o_proj.weight[:, 0] = 0.0
                layer.self_attn.o_proj.weight[4, 0] = 1.0  # -> dim4
        head = t.codec_head.weight
        eos = CODEC["codec_eos_token_id"]
        head[:, r] = 0.0
        head[eos, :] = 0.0
        head[eos, 0] = 3000.0
        head[eos, 1] = -30.0
        head[eos, 4] = 3000.0


def write(out: Path, tts_type: str = "custom_voice", seed: int = 0) -> dict[str, int]:
    """Write the model folder to ``out`` (replaced). Its total bytes and parameter counts."""
    if tts_type not in TYPES:
        raise ValueError(f"--type must be one of {', '.join(TYPES)}, not {tts_type!r}")
    _qwen_tts()
    torch: Any = importlib.import_module("torch")
    models: Any = importlib.import_module("qwen_tts.core.models")
    codec_models: Any = importlib.import_module("qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2")
    transformers: Any = importlib.import_module("transformers")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        tok, ids = build_text_tokenizer(Path(tmp))
    text_vocab = (len(tok) + 7) // 8 * 8

    torch.manual_seed(seed)
    cfg = models.Qwen3TTSConfig(
        talker_config=talker_config(text_vocab, tts_type),
        # ECAPA speaker encoder, built only for tts_model_type == "base"; enc_dim == talker hidden
        speaker_encoder_config={
            "enc_dim": 32,
            "enc_channels": [8, 8, 8, 8, 24],
            "enc_attention_channels": 8,
            "enc_res2net_scale": 2,
            "enc_se_channels": 8,
        },
        tokenizer_type="qwen3_tts_tokenizer_12hz",
        tts_model_size="tiny",
        tts_model_type=tts_type,
        im_start_token_id=ids["<|im_start|>"],
        im_end_token_id=ids["<|im_end|>"],
        tts_pad_token_id=ids["<|tts_pad|>"],
        tts_bos_token_id=ids["<|tts_text_bos|>"],
        tts_eos_token_id=ids["<|tts_text_eod|>"],
    )
    model = models.Qwen3TTSForConditionalGeneration(cfg).eval()
    install_length_rule(model, ids["<|endoftext|>"], ids["<|tts_text_eod|>"])
    model.save_pretrained(out, safe_serialization=True)
    # The package's own save does not reload: PretrainedConfig.to_dict() writes "model_type": ""
    # into the nested speaker encoder config, whose __init__ takes no **kwargs. Drop that key.
    cfg_path = out / "config.json"
    saved = json.loads(cfg_path.read_text(encoding="utf-8"))
    saved["speaker_encoder_config"].pop("model_type", None)
    cfg_path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    # the generation defaults the package merges into generate_*() (read as plain JSON)
    gen = {
        "do_sample": True,
        "top_k": 50,
        "top_p": 1.0,
        "temperature": 0.9,
        "repetition_penalty": 1.05,
        "subtalker_dosample": True,
        "subtalker_top_k": 50,
        "subtalker_top_p": 1.0,
        "subtalker_temperature": 0.9,
        "max_new_tokens": 256,
    }
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tok.save_pretrained(out)

    torch.manual_seed(seed + 1)
    codec = codec_models.Qwen3TTSTokenizerV2Model(speech_tokenizer_config()).eval()
    with torch.no_grad():
        # The package's init leaves the codebooks at zero (every code decodes alike) and its
        # std=0.02 init shrinks the waveform to ~1e-9: use torch's default fan-in init for the
        # codec's layers and random codebooks, so the audio is audible.
        for mod in codec.modules():
            if isinstance(mod, (torch.nn.Conv1d, torch.nn.ConvTranspose1d, torch.nn.Linear)):
                mod.reset_parameters()
        for name, p in codec.named_parameters():
            if name.endswith("_codebook.embedding_sum"):
                p.normal_(0.0, 1.0)
    codec_dir = out / "speech_tokenizer"
    codec.save_pretrained(codec_dir, safe_serialization=True)
    transformers.EncodecFeatureExtractor(
        feature_size=1, sampling_rate=SAMPLE_RATE, padding_value=0.0, chunk_length_s=None, overlap=None
    ).save_pretrained(codec_dir)
    return {
        "bytes": sum(p.stat().st_size for p in out.rglob("*") if p.is_file()),
        "talker_params": sum(p.numel() for p in model.parameters()),
        "codec_params": sum(p.numel() for p in codec.parameters()),
    }


#: The engine interpreter a run without torch and qwen-tts hands itself to.
PYTHON_ENV = "WERK_QWEN_TTS_PYTHON"
_HANDED = "WERK_QWEN_TTS_TESTMODEL_HANDED"


def _in_engine() -> None:
    """Without torch or qwen-tts here (Werk's own environment, where ``werk_qwen_tts`` is
    installed), run this file by path in the engine interpreter ``WERK_QWEN_TTS_PYTHON`` names
    (``os.execv``: its exit status is this command's); without one, exit naming the variable."""
    if importlib.util.find_spec("torch") is not None and importlib.util.find_spec("qwen_tts") is not None:
        return
    engine = os.environ.get(PYTHON_ENV, "")
    if engine and Path(engine).is_file() and not os.environ.get(_HANDED):  # handed over once at most
        os.environ[_HANDED] = "1"
        os.execv(engine, [engine, str(Path(__file__).resolve()), *sys.argv[1:]])
    sys.exit(f"testmodel: needs torch and qwen-tts: set {PYTHON_ENV} (bash scripts/setup-engine-venv.sh qwen-tts)")


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        _in_engine()
    parser = argparse.ArgumentParser(prog="testmodel", description="Write a tiny random-weight Qwen3-TTS folder.")
    parser.add_argument("out", type=Path)
    parser.add_argument("--type", choices=TYPES, default="custom_voice", dest="tts_type")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    stats = write(args.out, args.tts_type, args.seed)
    print(
        f"testmodel: wrote {args.out} ({args.tts_type}, seed {args.seed}): {stats['bytes']} bytes, "
        f"talker {stats['talker_params']} + codec {stats['codec_params']} parameters",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
