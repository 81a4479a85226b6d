"""werk_onnx_genai.testing: what tests and benchmarks use, never the backend itself.

:func:`tiny_genai_model` converts a Hugging Face checkpoint (the tiny random Llama that
``werk-transformers``' test kit writes, ``werk_transformers.testing.testmodel``: the test extra
depends on it, so the same checkpoint serves both backends and the benchmark) into a GenAI model directory with
``onnxruntime_genai.models.builder`` (FP32, CPU), offline, run by the engine virtualenv's
interpreter, and caches it under ``${XDG_CACHE_HOME:-~/.cache}/werk/models/`` keyed by the
generator versions (this one's and the checkpoint's) and the onnxruntime-genai version that
built it. Nothing the plugin loads at run time imports this package.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from werk_transformers.testing import GENERATOR_VERSION as CHECKPOINT_VERSION
from werk_transformers.testing import TESTMODEL

from werk_host.plugin import user_cache_dir

__all__ = ["GENERATOR_VERSION", "tiny_genai_model"]

GENERATOR_VERSION = "1"


def _run(argv: list[str], timeout: float) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(argv, check=False, capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[1]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def tiny_genai_model(python: str, *, seed: int = 0, timeout: float = 600.0) -> Path:
    """The cached GenAI model directory for ``seed``, built once by ``python`` (an interpreter
    with onnxruntime-genai, onnx, onnx-ir, torch and transformers). A private copy is written and
    renamed into place, so a reader never sees a half-written directory."""
    version = _run([python, "-c", "import onnxruntime_genai as og; print(og.__version__)"], 120).strip()
    root = user_cache_dir() / "models"
    dest = root / f"tiny-llama-genai-v{GENERATOR_VERSION}-hf{CHECKPOINT_VERSION}-og{version}-seed{seed}"
    if (dest / "genai_config.json").is_file():
        return dest
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".tiny-genai-", dir=root))
    try:
        hf = scratch / "hf"
        _run([python, str(TESTMODEL), str(hf), "--seed", str(seed)], timeout)
        builder = [python, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(scratch / "model")]
        _run([*builder, "-p", "fp32", "-e", "cpu", "-c", str(scratch / "cache")], timeout)
        try:
            (scratch / "model").rename(dest)
        except OSError:
            if not (dest / "genai_config.json").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return dest
