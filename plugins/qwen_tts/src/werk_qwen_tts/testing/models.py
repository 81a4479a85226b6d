"""What tests and benchmarks use on the host side (never the backend itself):

* :func:`tiny_model`: the tiny random-weight Qwen3-TTS folder of
  :mod:`~werk_qwen_tts.testing.testmodel`, written once by the engine interpreter and cached
  by the generator's hash under ``${XDG_CACHE_HOME:-~/.cache}/werk/models/``;
* :class:`Direct` (and :func:`direct`, one call of it): syntheses by the ``qwen-tts`` package
  called directly in a process of the engine interpreter that keeps the model loaded
  (``Qwen3TTSModel.from_pretrained`` once, then per body ``torch.manual_seed`` and
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
from pathlib import Path
from typing import Any

from werk_host.plugin import user_cache_dir

__all__ = ["SRC", "TESTMODEL", "WORKER", "Direct", "direct", "tiny_model"]

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
started = time.perf_counter()
tts = qwen_tts.Qwen3TTSModel.from_pretrained(sys.argv[2], dtype=torch.float32)
print(json.dumps({"load_s": time.perf_counter() - started}), flush=True)
for line in sys.stdin:
    body = json.loads(line)
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
    elapsed = time.perf_counter() - begin
    samples = np.round(np.clip(np.asarray(wavs[0], dtype=np.float32).reshape(-1), -1.0, 1.0) * 32767.0)
    pcm = base64.b64encode(samples.astype("<i2").tobytes()).decode()
    print(json.dumps({"pcm": pcm, "sample_rate": int(rate), "synth_s": elapsed}), flush=True)
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


class Direct:
    """The package's own synthesis in one engine-interpreter process that keeps ``model_dir``
    loaded (module docstring): call it with a body (``input``, ``voice``, ``language``,
    ``instructions``, ``seed``) for ``pcm`` (the 16-bit little-endian samples, as bytes),
    ``sample_rate`` and ``synth_s`` (the package call's seconds); ``load_s`` is the load's.
    A context manager: the process ends with the block."""

    def __init__(self, python: str, model_dir: Path, *, threads: int = 1) -> None:
        self.proc = subprocess.Popen(
            [python, "-c", DIRECT, str(WORKER), str(model_dir), str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, **ENV},
            text=True,
        )
        self.load_s = float(self._answer()["load_s"])

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            stderr = self.proc.stderr.read() if self.proc.stderr is not None else ""
            raise RuntimeError(f"the direct synthesis failed: {stderr[-2000:]}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(body) + "\n")
        self.proc.stdin.flush()
        answer = self._answer()
        answer["pcm"] = base64.b64decode(answer["pcm"])
        return answer

    def __enter__(self) -> Direct:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def direct(python: str, model_dir: Path, body: dict[str, Any], *, threads: int = 1) -> dict[str, Any]:
    """One synthesis of ``body`` by the package called directly (:class:`Direct`)."""
    with Direct(python, model_dir, threads=threads) as synth:
        return synth(body)
