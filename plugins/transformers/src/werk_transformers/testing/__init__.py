"""werk_transformers.testing: what tests and benchmarks use, never the backend itself.

* :mod:`~werk_transformers.testing.testmodel`: write a tiny random-weight Llama checkpoint,
  run by path with the engine virtualenv's interpreter; :func:`tiny_checkpoint` caches it by
  generator version under ``${XDG_CACHE_HOME:-~/.cache}/werk/models/``.

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

__all__ = ["GENERATOR_VERSION", "TESTMODEL", "tiny_checkpoint"]

#: Bump when testmodel.py writes different files: the cache directory is keyed by it.
GENERATOR_VERSION = "2"
TESTMODEL = Path(__file__).with_name("testmodel.py")


def tiny_checkpoint(python: str, *, seed: int = 0, timeout: float = 300.0) -> Path:
    """The cached tiny checkpoint for ``seed``, written once by ``python`` (an interpreter with
    torch, transformers and tokenizers). Concurrent callers each write a private copy and the
    first rename wins, so a reader never sees a half-written directory."""
    root = user_cache_dir() / "models"
    dest = root / f"tiny-llama-v{GENERATOR_VERSION}-seed{seed}"
    if (dest / "config.json").is_file():
        return dest
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".tiny-llama-", dir=root))
    try:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        subprocess.run(
            [python, str(TESTMODEL), str(scratch / "model"), "--seed", str(seed)],
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
