"""werk_diffusers.testing: what tests and benchmarks use, never the backend itself.

* :mod:`~werk_diffusers.testing.testmodel`: write a tiny random-weight Stable Diffusion
  pipeline folder, run by path with the engine virtualenv's interpreter; :func:`tiny_pipeline`
  caches it by the generator script's hash under ``${XDG_CACHE_HOME:-~/.cache}/werk/models/``.
* :func:`direct`: run one ``/images`` request body on a folder with the worker's own
  generation function (``worker.py``'s ``load_pipeline`` and ``generate``, loaded by path in a
  subprocess of the engine interpreter, nothing of Werk in between): the PNG bytes a request
  through Werk must equal.

Nothing the plugin loads at run time imports this package (``tests/test_diffusers_rules.py``
checks it).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from werk_host.plugin import user_cache_dir

__all__ = ["TESTMODEL", "WORKER", "direct", "tiny_pipeline"]

TESTMODEL = Path(__file__).with_name("testmodel.py")
WORKER = Path(__file__).parents[1] / "worker.py"
ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}

DIRECT = """
import base64, importlib, importlib.util, json, sys
spec = importlib.util.spec_from_file_location("werk_diffusers_worker", sys.argv[1])
worker = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = worker
spec.loader.exec_module(worker)
torch = importlib.import_module("torch")
diffusers = importlib.import_module("diffusers")
diffusers.utils.logging.disable_progress_bar()
threads = int(sys.argv[3])
if threads > 0:
    torch.set_num_threads(threads)
body = json.loads(sys.stdin.read())
loaded = worker.load_pipeline(torch, diffusers, sys.argv[2], "cpu")
result = worker.generate(torch, diffusers, loaded, body, lambda k, n: None, lambda: False)
print(json.dumps(result["images"]))
"""


def tiny_pipeline(python: str, *, seed: int = 0, timeout: float = 300.0) -> Path:
    """The cached tiny pipeline folder for ``seed``, written once by ``python`` (an interpreter
    with torch, transformers and diffusers). Concurrent callers each write a private copy and
    the first rename wins, so a reader never sees a half-written folder."""
    version = hashlib.sha256(TESTMODEL.read_bytes()).hexdigest()[:12]
    root = user_cache_dir() / "models"
    dest = root / f"tiny-sd-{version}-seed{seed}"
    if (dest / "model_index.json").is_file():
        return dest
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".tiny-sd-", dir=root))
    try:
        subprocess.run(
            [python, str(TESTMODEL), str(scratch / "model"), "--seed", str(seed)],
            check=True,
            capture_output=True,
            env={**os.environ, **ENV},
            timeout=timeout,
        )
        try:
            (scratch / "model").rename(dest)
        except OSError:
            if not (dest / "model_index.json").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return dest


def direct(
    python: str, model_dir: Path, request: dict[str, Any], *, threads: int = 1, timeout: float = 300.0
) -> list[bytes]:
    """The PNG bytes of ``request`` (a worker ``/images`` body without ``model_dir`` and
    ``identity``) run directly on ``model_dir`` by the worker's generation function."""
    done = subprocess.run(
        [python, "-c", DIRECT, str(WORKER), str(model_dir), str(threads)],
        input=json.dumps(request),
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **ENV},
        timeout=timeout,
    )
    images = json.loads(done.stdout.strip().splitlines()[-1])
    return [base64.b64decode(i) for i in images]
