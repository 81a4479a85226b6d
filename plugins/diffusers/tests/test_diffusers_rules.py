"""Rules that need no engine: options, the pipeline LRU's bound, which manifests the backend
takes (and that the transformers backend refuses a Diffusers folder), the recursive manifest of
``werk models add DIR``, the limits read from the folder, the doctor checks, and that nothing
the plugin loads at run time imports its testing package."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from werk_diffusers.adapter import SAMPLERS, WORKER, accepts, read_limits
from werk_diffusers.plugin import werk_doctor_checks
from werk_diffusers.settings import CACHE_SIZE_ENV, PYTHON_ENV, cache_size, parse_options

from werk_host.plugin import HostConfig, ModelManifest
from werk_host.plugin.checkpoints import checkpoint_dir, checkpoint_manifest, diffusers_dir, is_diffusers_dir
from werk_host.testing.engines import assert_model_cache_size, werk_command
from werk_host.testing.markers import covers_hooks


def fake_folder(root: Path, class_name: str = "StableDiffusionPipeline") -> Path:
    """A Diffusers folder's layout with placeholder weights."""
    files = {
        "model_index.json": json.dumps({"_class_name": class_name}),
        "unet/config.json": json.dumps({"sample_size": 64}),
        "unet/diffusion_pytorch_model.safetensors": "x",
        "vae/config.json": json.dumps({"block_out_channels": [128, 256, 512, 512]}),
        "vae/diffusion_pytorch_model.safetensors": "x",
        "text_encoder/config.json": "{}",
        "text_encoder/model.safetensors": "x",
        "tokenizer/tokenizer.json": "{}",
        "scheduler/scheduler_config.json": "{}",
        ".cache/ignored": "x",
        "unet/.hidden": "x",
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


def test_the_pipeline_cache_size_defaults_to_one_and_must_be_positive() -> None:
    assert_model_cache_size(cache_size, CACHE_SIZE_ENV)


def test_a_diffusers_folder_is_listed_recursively_and_only_diffusers_takes_it(tmp_path: Path) -> None:
    folder = fake_folder(tmp_path / "sd")
    assert is_diffusers_dir(folder)
    manifest = checkpoint_manifest(folder)
    relative = [str(Path(f.path).relative_to(folder)) for f in manifest.files]
    assert relative == [
        "model_index.json",
        "scheduler/scheduler_config.json",
        "text_encoder/config.json",
        "text_encoder/model.safetensors",
        "tokenizer/tokenizer.json",
        "unet/config.json",
        "unet/diffusion_pytorch_model.safetensors",
        "vae/config.json",
        "vae/diffusion_pytorch_model.safetensors",
    ]
    assert manifest.params["architecture"] == "StableDiffusionPipeline"
    assert diffusers_dir(manifest) == folder and accepts(manifest)
    assert checkpoint_dir(manifest) is None
    assert not accepts(ModelManifest.from_paths("m", [folder / "unet/config.json"]))
    assert accepts(ModelManifest.from_paths("m", [folder / "unet/config.json"], backend="diffusers"))
    assert not accepts(ModelManifest.from_paths("m", [folder / "model_index.json"], backend="transformers"))
    assert not accepts(None)
    transformers = pytest.importorskip("werk_transformers.adapter")
    flat = tmp_path / "flat"
    flat.mkdir()
    for name in ("model_index.json", "config.json", "model.safetensors"):
        (flat / name).write_text("{}")
    assert not transformers.accepts(ModelManifest.from_paths("m", sorted(flat.iterdir())))
    assert not transformers.accepts(manifest)


def test_werk_models_add_registers_every_file_of_a_diffusers_folder(tmp_path: Path) -> None:
    folder = fake_folder(tmp_path / "sd")
    done = werk_command(tmp_path / "home", "models", "add", "sd", str(folder), "--json")
    assert done.returncode == 0, done.stderr
    listed = werk_command(tmp_path / "home", "models", "--json")
    (record,) = [m for m in json.loads(listed.stdout) if m["name"] == "sd"]
    assert [Path(f["path"]).relative_to(folder).as_posix() for f in record["files"]] == [
        str(Path(f.path).relative_to(folder).as_posix()) for f in checkpoint_manifest(folder).files
    ]


def test_limits_come_from_the_folder_and_match_the_worker_samplers(tmp_path: Path) -> None:
    limits = read_limits(fake_folder(tmp_path / "sd"))
    assert limits.default_size == 512 and limits.default_steps == 20 and limits.img2img
    assert limits.default_sampler == "Euler a" and limits.samplers == list(SAMPLERS)
    assert not read_limits(fake_folder(tmp_path / "other", "WanPipeline")).img2img
    spec = importlib.util.spec_from_file_location("werk_diffusers_worker_rules", WORKER)
    assert spec is not None and spec.loader is not None
    worker = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = worker
    spec.loader.exec_module(worker)
    assert list(worker.SAMPLERS) == list(SAMPLERS) and limits.default_sampler == worker.DEFAULT_SAMPLER


@covers_hooks("werk_doctor_checks")
def test_doctor_names_the_engine_interpreter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PYTHON_ENV, raising=False)
    checks = {c.name: c for c in werk_doctor_checks(HostConfig(home=tmp_path))}
    assert checks["diffusers.engine"].status == "warn" and PYTHON_ENV in checks["diffusers.engine"].detail
    assert checks["diffusers.model_cache"].status == "ok"
    monkeypatch.setenv(CACHE_SIZE_ENV, "zero")
    (bad,) = werk_doctor_checks(HostConfig(home=tmp_path))
    assert bad.status == "fail" and CACHE_SIZE_ENV in bad.detail


@pytest.mark.engine
@covers_hooks("werk_doctor_checks")
def test_doctor_runs_the_engine_probe(tmp_path: Path, engine: str) -> None:
    config = HostConfig(home=tmp_path, backend_options={"diffusers": {"python": engine}})
    checks = {c.name: c for c in werk_doctor_checks(config)}
    assert checks["diffusers.engine"].status == "ok" and "diffusers 0.42.1" in checks["diffusers.engine"].detail


def test_the_runtime_never_imports_the_testing_package() -> None:
    probe = "import sys, werk_diffusers.plugin; print(any(m.startswith('werk_diffusers.testing') for m in sys.modules))"
    assert (
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )
