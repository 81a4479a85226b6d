"""werk_transformers.testing: what tests and benchmarks use, never the backend itself.

* :mod:`~werk_transformers.testing.testmodel`: write a tiny random-weight Llama checkpoint,
  run by path with the engine virtualenv's interpreter; :func:`tiny_checkpoint` caches it by
  generator version under ``${XDG_CACHE_HOME:-~/.cache}/werk/models/``.
* :mod:`~werk_transformers.testing.testencoder`: write a tiny random-weight BERT encoder with a
  WordPiece tokenizer (the embedding tests' model); :func:`tiny_encoder` caches it the same way.

Nothing the plugin loads at run time imports this package (``tests/test_transformers_rules.py``
checks it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from werk_host.plugin import user_cache_dir

__all__ = ["ENCODER_VERSION", "GENERATOR_VERSION", "TESTENCODER", "TESTMODEL", "tiny_checkpoint", "tiny_encoder"]

#: Bump when testmodel.py writes different files: the cache directory is keyed by it.
GENERATOR_VERSION = "2"
TESTMODEL = Path(__file__).with_name("testmodel.py")
#: Bump when testencoder.py writes different files.
ENCODER_VERSION = "1"
TESTENCODER = Path(__file__).with_name("testencoder.py")


def tiny_checkpoint(python: str, *, seed: int = 0, timeout: float = 300.0) -> Path:
    """The cached tiny checkpoint for ``seed``, written once by ``python`` (an interpreter with
    torch, transformers and tokenizers). Concurrent callers each write a private copy and the
    first rename wins, so a reader never sees a half-written directory."""
    return _cached(python, TESTMODEL, f"tiny-llama-v{GENERATOR_VERSION}", seed, timeout)


def tiny_encoder(python: str, *, seed: int = 0, timeout: float = 300.0) -> Path:
    """The cached tiny BERT encoder for ``seed`` (:mod:`~werk_transformers.testing.testencoder`),
    written once by ``python`` as :func:`tiny_checkpoint` writes its model."""
    return _cached(python, TESTENCODER, f"tiny-bert-v{ENCODER_VERSION}", seed, timeout)


def _cached(python: str, script: Path, name: str, seed: int, timeout: float) -> Path:
    root = user_cache_dir() / "models"
    dest = root / f"{name}-seed{seed}"
    if (dest / "config.json").is_file():
        return dest
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        subprocess.run(
            [python, str(script), str(scratch / "model"), "--seed", str(seed)],
            check=True,
            capture_output=True,
            env=env,
            timeout=timeout,
        )
        try:
            (scratch / "model").rename(dest)
        except OSError:
            if not (dest / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return dest
