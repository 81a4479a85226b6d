"""What tests and benchmarks use on the host side (never the backend itself):

* :func:`tiny_model`: the tiny random-weight Qwen3-TTS folder of
  :mod:`~werk_qwen_tts.testing.testmodel`, written once by the engine interpreter and cached
  by the generator's hash under ``${XDG_CACHE_HOME:-~/.cache}/werk/models/``;
* :func:`direct`: one synthesis with the ``qwen-tts`` package called directly in the engine
  interpreter (``Qwen3TTSModel.from_pretrained``, ``torch.manual_seed``, then
  ``generate_custom_voice`` or ``generate_voice_design``; nothing of Werk or its worker in
  between, only the worker's torchaudio stand-in for the import): the 16-bit samples a request
  through Werk must equal, and its sample rate.

(``werk_qwen_tts.testing`` itself imports nothing: the engine interpreter runs the generator as
``-m werk_qwen_tts.testing.testmodel`` through it.)
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from werk_host.plugin import user_cache_dir

__all__ = ["SRC", "TESTMODEL", "WORKER", "direct", "tiny_model"]

TESTMODEL = Path(__file__).with_name("testmodel.py")
WORKER = Path(__file__).parents[1] / "worker.py"
#: The plugin's source root, which the engine interpreter puts on its path to run the generator.
SRC = Path(__file__).parents[2]
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}

DIRECT = """
import base64, importlib.util, json, sys, time
spec = importlib.util.spec_from_file_location("werk_qwen_tts_worker", sys.argv[1])
worker = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = worker
spec.loader.exec_module(worker)
qwen_tts = worker.import_qwen_tts()  # offline, with the torchaudio stand-in (worker.py)
import numpy as np, torch
threads = int(sys.argv[3])
if threads > 0:
    torch.set_num_threads(threads)
body = json.loads(sys.stdin.read())
started = time.perf_counter()
tts = qwen_tts.Qwen3TTSModel.from_pretrained(sys.argv[2], dtype=torch.float32)
loaded = time.perf_counter()
times = []
for _ in range(int(body.get("repeat", 1))):
    begin = time.perf_counter()
    torch.manual_seed(int(body["seed"]))
    with torch.inference_mode():
        if tts.model.tts_model_type == "voice_design":
            wavs, rate = tts.generate_voice_design(body["input"], instruct=body.get("instructions") or "",
                                                   language=body.get("language") or "Auto", non_streaming_mode=True)
        else:
            wavs, rate = tts.generate_custom_voice(body["input"], speaker=body["voice"],
                                                   language=body.get("language") or "Auto",
                                                   instruct=body.get("instructions"), non_streaming_mode=True)
    times.append(time.perf_counter() - begin)
samples = np.round(np.clip(np.asarray(wavs[0], dtype=np.float32).reshape(-1), -1.0, 1.0) * 32767.0).astype("<i2")
print(json.dumps({"pcm": base64.b64encode(samples.tobytes()).decode(), "sample_rate": int(rate),
                  "load_s": loaded - started, "synth_s": times}))
"""


def tiny_model(python: str, *, kind: str = "custom_voice", seed: int = 0, timeout: float = 300.0) -> Path:
    """The cached tiny model folder of ``kind`` and ``seed``, written once by ``python`` (the
    engine interpreter). Concurrent callers each write a private copy and the first rename wins,
    so a reader never sees a half-written folder."""
    version = hashlib.sha256(TESTMODEL.read_bytes()).hexdigest()[:12]
    root = user_cache_dir() / "models"
    dest = root / f"tiny-qwen3-tts-{kind}-{version}-seed{seed}"
    if (dest / "speech_tokenizer" / "config.json").is_file():
        return dest
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".tiny-qwen3-tts-", dir=root))
    try:
        out = work / "model"
        env = {**os.environ, **ENV, "PYTHONPATH": str(SRC)}
        subprocess.run(
            [python, "-m", "werk_qwen_tts.testing.testmodel", str(out), f"--type={kind}", f"--seed={seed}"],
            env=env,
            check=True,
            timeout=timeout,
            capture_output=True,
        )
        try:
            out.rename(dest)
        except OSError:
            if not (dest / "speech_tokenizer" / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dest


def direct(python: str, model_dir: Path, body: dict[str, Any], *, threads: int = 1, repeat: int = 1) -> dict[str, Any]:
    """The package's own synthesis of ``body`` (``input``, ``voice``, ``language``,
    ``instructions``, ``seed``) on ``model_dir``, ``repeat`` times in one process: ``pcm``
    (the 16-bit little-endian samples, as bytes), ``sample_rate``, ``load_s`` and ``synth_s``
    (each run's seconds)."""
    started = time.monotonic()
    done = subprocess.run(
        [python, "-c", DIRECT, str(WORKER), str(model_dir), str(threads)],
        input=json.dumps({**body, "repeat": repeat}),
        env={**os.environ, **ENV},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"the direct synthesis failed after {time.monotonic() - started:.1f} s: {done.stderr[-2000:]}"
        )
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    answer["pcm"] = base64.b64decode(answer["pcm"])
    return answer
