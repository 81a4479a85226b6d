"""Rules that need no engine: options, the model LRU's bound, which manifests the backend takes
(and that the transformers backend refuses a Qwen3-TTS folder), the recursive manifest of
``werk models add DIR``, the limits read from the folder, the doctor checks, and that nothing
the plugin loads at run time imports its testing package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from werk_qwen_tts.adapter import accepts, create_adapter, read_model
from werk_qwen_tts.plugin import werk_doctor_checks
from werk_qwen_tts.settings import CACHE_SIZE_ENV, PYTHON_ENV, cache_size, parse_options

from werk_host.plugin import ErrorCode, HostConfig, ModelManifest, WerkError
from werk_host.plugin.checkpoints import checkpoint_dir, checkpoint_manifest, model_root
from werk_host.testing.engines import assert_model_cache_size, werk_command
from werk_host.testing.markers import covers_hooks


def fake_folder(root: Path, kind: str = "custom_voice", size: str = "1b7") -> Path:
    """A Qwen3-TTS folder's layout with placeholder weights."""
    config = {
        "model_type": "qwen3_tts",
        "tts_model_type": kind,
        "tts_model_size": size,
        "talker_config": {
            "spk_id": {"Vivian": 3000, "Ryan": 3001},
            "codec_language_id": {"english": 2050, "chinese": 2055, "beijing_dialect": 2074},
        },
    }
    files = {
        "config.json": json.dumps(config),
        "model.safetensors": "x",
        "generation_config.json": "{}",
        "tokenizer_config.json": "{}",
        "vocab.json": "{}",
        "merges.txt": "",
        "speech_tokenizer/config.json": json.dumps({"output_sample_rate": 24000}),
        "speech_tokenizer/model.safetensors": "x",
        ".cache/ignored": "x",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_options_are_checked_by_name_without_echoing_values() -> None:
    assert parse_options({"device": "cuda:1", "threads": 2}, env={}).device == "cuda:1"
    assert parse_options({}, env={PYTHON_ENV: "/x/python"}).python == "/x/python"
    for bad, named in [({"devcie": "cpu"}, "devcie"), ({"device": "tpu9"}, "device"), ({"threads": -1}, "threads")]:
        with pytest.raises(ValueError, match=named) as caught:
            parse_options(bad, env={})
        assert "tpu9" not in str(caught.value)


def test_the_model_cache_size_defaults_to_one_and_must_be_positive() -> None:
    assert_model_cache_size(cache_size, CACHE_SIZE_ENV)


def test_a_qwen_folder_is_listed_recursively_and_only_this_backend_takes_it(tmp_path: Path) -> None:
    folder = fake_folder(tmp_path / "tts")
    manifest = checkpoint_manifest(folder)
    relative = [str(Path(f.path).relative_to(folder)) for f in manifest.files]
    assert relative == [
        "config.json",
        "generation_config.json",
        "merges.txt",
        "model.safetensors",
        "speech_tokenizer/config.json",
        "speech_tokenizer/model.safetensors",
        "tokenizer_config.json",
        "vocab.json",
    ]
    assert model_root(manifest, "speech_tokenizer/config.json") == folder and accepts(manifest)
    assert checkpoint_dir(manifest) is None
    assert not accepts(ModelManifest.from_paths("m", [folder / "model.safetensors"]))
    assert accepts(ModelManifest.from_paths("m", [folder / "model.safetensors"], backend="qwen-tts"))
    assert not accepts(ModelManifest.from_paths("m", [folder / "config.json"], backend="transformers"))
    assert not accepts(None)
    transformers = pytest.importorskip("werk_transformers.adapter")
    assert not transformers.accepts(manifest)


def test_werk_models_add_registers_every_file_of_a_qwen_folder(tmp_path: Path) -> None:
    folder = fake_folder(tmp_path / "tts")
    done = werk_command(tmp_path / "home", "models", "add", "tts", str(folder), "--json")
    assert done.returncode == 0, done.stderr
    listed = werk_command(tmp_path / "home", "models", "--json")
    (record,) = [m for m in json.loads(listed.stdout) if m["name"] == "tts"]
    assert [Path(f["path"]).relative_to(folder).as_posix() for f in record["files"]] == [
        str(Path(f.path).relative_to(folder).as_posix()) for f in checkpoint_manifest(folder).files
    ]


def test_limits_come_from_the_folder_as_the_package_reads_it(tmp_path: Path) -> None:
    info = read_model(fake_folder(tmp_path / "cv"))
    assert info is not None
    assert info.speakers == ["ryan", "vivian"] and info.languages == ["auto", "chinese", "english"]
    assert info.sample_rate == 24000 and info.instructions
    small = read_model(fake_folder(tmp_path / "small", size="0b6"))
    assert small is not None and not small.instructions  # the package drops a 0.6B model's instruction
    design = read_model(fake_folder(tmp_path / "vd", kind="voice_design"))
    assert design is not None and design.speakers == [] and design.instructions
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert read_model(tmp_path / "plain") is None


def test_a_clone_model_or_a_foreign_folder_is_refused_before_any_worker(tmp_path: Path) -> None:
    config = HostConfig(home=tmp_path / "home", backend_options={"qwen-tts": {"python": sys.executable}})
    for folder, named in ((fake_folder(tmp_path / "base", kind="base"), "reference audio"),):
        with pytest.raises(WerkError) as caught:
            create_adapter(config, checkpoint_manifest(folder, "clone"))
        assert caught.value.code is ErrorCode.INVALID_REQUEST and named in caught.value.message
    with pytest.raises(WerkError) as caught:
        create_adapter(config, ModelManifest.from_paths("m", [fake_folder(tmp_path / "x") / "model.safetensors"]))
    assert "not a Qwen3-TTS folder" in caught.value.message
    assert not (tmp_path / "home" / "backends").exists()


@covers_hooks("werk_doctor_checks")
def test_doctor_names_the_engine_interpreter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PYTHON_ENV, raising=False)
    checks = {c.name: c for c in werk_doctor_checks(HostConfig(home=tmp_path))}
    assert checks["qwen-tts.engine"].status == "warn" and PYTHON_ENV in checks["qwen-tts.engine"].detail
    assert checks["qwen-tts.model_cache"].status == "ok"
    monkeypatch.setenv(CACHE_SIZE_ENV, "zero")
    (bad,) = werk_doctor_checks(HostConfig(home=tmp_path))
    assert bad.status == "fail" and CACHE_SIZE_ENV in bad.detail


@pytest.mark.engine
@covers_hooks("werk_doctor_checks")
def test_doctor_runs_the_engine_probe(tmp_path: Path, engine: str) -> None:
    config = HostConfig(home=tmp_path, backend_options={"qwen-tts": {"python": engine}})
    checks = {c.name: c for c in werk_doctor_checks(config)}
    assert checks["qwen-tts.engine"].status == "ok" and "qwen-tts 0.1.1" in checks["qwen-tts.engine"].detail


def test_the_runtime_never_imports_the_testing_package() -> None:
    probe = "import sys, werk_qwen_tts.plugin; print(any(m.startswith('werk_qwen_tts.testing') for m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


@pytest.mark.engine
def test_the_tiny_model_command_from_werk_s_environment_writes_the_cached_model(
    tmp_path: Path, engine: str, model: Path
) -> None:
    out = tmp_path / "tiny"
    done = subprocess.run(
        [sys.executable, "-m", "werk_qwen_tts.testing.testmodel", str(out)],
        env={**os.environ, PYTHON_ENV: engine},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    written = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert written == sorted(p.relative_to(model) for p in model.rglob("*") if p.is_file())
    assert all((out / p).read_bytes() == (model / p).read_bytes() for p in written)
