from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gguf
import pytest
from werk_llamacpp.process import LlamaServerProcess
from werk_llamacpp.testing.testmodel import BOS_ID, CHATML_TEMPLATE, EOS_ID, build_vocab, generate_model, main


def _field_str(reader: gguf.GGUFReader, key: str) -> str:
    value = reader.fields[key].contents()
    assert isinstance(value, str)
    return value


def test_vocab_is_spm_with_byte_fallback() -> None:
    tokens, scores, types = build_vocab()
    assert len(tokens) == len(set(tokens)) == len(scores) == len(types)
    assert tokens[:3] == ["<unk>", "<s>", "</s>"]
    byte_tokens = [t for t, ty in zip(tokens, types, strict=True) if ty == gguf.TokenType.BYTE]
    assert byte_tokens == [f"<0x{b:02X}>" for b in range(256)]
    assert "\u2581hello" in tokens and "<|im_start|>" in tokens and "<|im_end|>" in tokens


def test_generate_is_deterministic_and_configurable(tmp_path: Path) -> None:
    a = generate_model(tmp_path / "a.gguf")
    b = generate_model(tmp_path / "b.gguf")
    assert a.read_bytes() == b.read_bytes()
    c = generate_model(tmp_path / "c.gguf", seed=1)
    assert c.read_bytes() != a.read_bytes()
    big = generate_model(tmp_path / "big.gguf", dim=128, layers=3, heads=8, kv_heads=2, ctx=2048)
    reader = gguf.GGUFReader(big)
    assert _field_str(reader, "general.architecture") == "llama"
    assert reader.fields["llama.embedding_length"].contents() == 128
    assert reader.fields["llama.block_count"].contents() == 3
    assert reader.fields["llama.attention.head_count_kv"].contents() == 2
    assert reader.fields["llama.context_length"].contents() == 2048
    assert reader.fields["tokenizer.ggml.bos_token_id"].contents() == BOS_ID
    assert reader.fields["tokenizer.ggml.eos_token_id"].contents() == EOS_ID
    assert _field_str(reader, "tokenizer.chat_template") == CHATML_TEMPLATE
    assert len(reader.tensors) == 2 + 9 * 3 + 1


def test_invalid_shapes_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        generate_model(tmp_path / "x.gguf", dim=66, heads=4)
    with pytest.raises(ValueError):
        generate_model(tmp_path / "x.gguf", heads=4, kv_heads=3)


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.gguf"
    assert main([str(out), "--dim", "32", "--layers", "1", "--heads", "2", "--ctx", "512"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert gguf.GGUFReader(out).fields["llama.embedding_length"].contents() == 32


#: In a fresh interpreter: load the plugin's entry points as the host does, import every other
#: module of the package outside ``werk_llamacpp.testing``, and list what got imported.
_RUNTIME_IMPORTS = """
import importlib, importlib.metadata as md, importlib.util, json, pkgutil, sys
for group in ("werk", "werk.cli"):
    (ep,) = [ep for ep in md.entry_points(group=group) if ep.name == "llamacpp"]
    ep.load()
import werk_llamacpp
for info in pkgutil.iter_modules(werk_llamacpp.__path__, "werk_llamacpp."):
    if info.name != "werk_llamacpp.testing":
        importlib.import_module(info.name)
print(json.dumps({
    "modules": sorted(n for n in sys.modules if n.split(".")[0] in ("werk_llamacpp", "gguf", "numpy")),
    "old_home": importlib.util.find_spec("werk_llamacpp.testmodel") is not None,
}))
"""


def test_the_runtime_never_imports_the_generator() -> None:
    """The generator lives in ``werk_llamacpp.testing``, which no runtime module imports (nor
    gguf/numpy, which only the ``testmodel`` extra installs)."""
    run = subprocess.run([sys.executable, "-c", _RUNTIME_IMPORTS], capture_output=True, text=True, check=True)
    found = json.loads(run.stdout)
    assert not found["old_home"]
    assert "werk_llamacpp.plugin" in found["modules"] and "werk_llamacpp.cli" in found["modules"]
    assert [m for m in found["modules"] if m.split(".")[0] != "werk_llamacpp" or ".testing" in m] == []


@pytest.mark.llamaserver
class TestOnServer:
    def test_generates_tokens(self, server: LlamaServerProcess) -> None:
        assert server.client is not None
        res = server.client.completion("hello world", n_predict=16, temperature=1.0, seed=7, ignore_eos=True)
        assert res.predicted_n == 16
        assert res.stop_type == "limit" and res.finish_reason == "length"
        assert isinstance(res.content, str)  # random bytes: possibly U+FFFD, never an exception

    def test_tokenizer_is_real(self, server: LlamaServerProcess) -> None:
        assert server.client is not None
        tokens, _, _ = build_vocab()
        ids = server.client.tokenize("hello world")
        assert ids == [tokens.index("\u2581hello"), tokens.index("\u2581world")]
        # byte fallback: "é" is not in the vocabulary, its UTF-8 bytes are
        ids = server.client.tokenize("é")
        assert ids == [tokens.index("\u2581"), tokens.index("<0xC3>"), tokens.index("<0xA9>")]
        assert server.client.detokenize(server.client.tokenize("the model")).strip() == "the model"
        with_bos = server.client.tokenize("hello", add_special=True)
        assert with_bos[0] == BOS_ID

    def test_apply_template_renders_chatml(self, server: LlamaServerProcess) -> None:
        assert server.client is not None
        prompt = server.client.apply_template(
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello?"}]
        )
        assert (
            prompt
            == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello?<|im_end|>\n<|im_start|>assistant\n"
        )
        ids = server.client.tokenize(prompt)
        tokens, _, _ = build_vocab()
        assert ids[0] == tokens.index("<|im_start|>")  # control tokens are parsed as such
