"""Speech through Werk vs the ``qwen-tts`` package called directly, jobs vs the synchronous
route, and the model's load (docs/media.md, "Speech").

The tiny random-weight Qwen3-TTS model (``werk_qwen_tts.testing.models.tiny_model``), a fixed
sentence, voice ``alice``, a fixed seed, WAV, torch on ``--threads`` CPU threads on both
sides. Measured side by side in one run:

* **direct**: ``Qwen3TTSModel.from_pretrained`` and ``generate_custom_voice`` in a process of
  the same engine interpreter (``werk_qwen_tts.testing.models.Direct``), the model loaded once,
  each synthesis timed (the package call alone) after ``--warmup`` untimed ones, alternated
  with the routes below so that drift in the machine's speed hits every side alike;
* **speech**: ``POST /v1/audio/speech`` on a real ``werk serve`` with the ``qwen-tts`` backend
  (the model registered with ``werk models add``), warm, the same request;
* **job**: ``POST /werk/v1/jobs`` (``kind: speech``) then ``GET /werk/v1/jobs/{id}`` every
  ``--poll-ms`` until it succeeded, then ``GET .../result/speech.wav``; against the
  synchronous route, alternated with it;
* **load**: the first request on a freshly started host (its worker process starts with the
  instance; the request loads the model into the worker's LRU) against the second.

Targets: ``RATIO speech_vs_direct`` <= 1.10; the job's added time p50 <= 50 ms; the load ratio
is printed::

    WERK_QWEN_TTS_PYTHON=$(bash scripts/setup-engine-venv.sh qwen-tts | tail -n1) \\
        .venv/bin/python bench/speech.py [--runs 15] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from werk_qwen_tts.testing.models import Direct, tiny_model  # noqa: E402

from werk_host.testing.api import Api  # noqa: E402
from werk_host.testing.hosts import serve_process  # noqa: E402

KEY = "sk-werk-bench-speech"
MODEL = "tiny-tts"
SENTENCE = "Hello world. This is the sentence the speech benchmark speaks."
VOICE, SEED = "alice", 1234


def _post(base: str, path: str, body: object) -> bytes:
    request = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=600) as answer:
        data: bytes = answer.read()
        return data


def _speech(api: Api) -> float:
    body = {"model": MODEL, "input": SENTENCE, "voice": VOICE, "response_format": "wav", "seed": SEED}
    began = time.perf_counter()
    audio = _post(api.base, "/v1/audio/speech", body)
    elapsed = time.perf_counter() - began
    assert audio.startswith(b"RIFF"), audio[:200]
    return elapsed


def _job(api: Api, poll_s: float) -> float:
    fields = {"input": SENTENCE, "voice": VOICE, "response_format": "wav", "seed": SEED}
    began = time.perf_counter()
    status, doc = api.post("/werk/v1/jobs", {"kind": "speech", "model": MODEL, "input": fields})
    assert status == 202, doc
    job_id = doc["data"]["id"]
    while (view := api.get(f"/werk/v1/jobs/{job_id}")[1]["data"])["status"] in ("queued", "running"):
        time.sleep(poll_s)
    assert view["status"] == "succeeded", view
    request = urllib.request.Request(
        f"{api.base}/werk/v1/jobs/{job_id}/result/speech.wav", headers={"Authorization": f"Bearer {KEY}"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        answer.read()
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--poll-ms", type=float, default=5.0)
    args = parser.parse_args()
    python = os.environ.get("WERK_QWEN_TTS_PYTHON")
    if not python:
        print("set WERK_QWEN_TTS_PYTHON (bash scripts/setup-engine-venv.sh qwen-tts | tail -n1)", file=sys.stderr)
        return 2
    model = tiny_model(python)
    body = {"input": SENTENCE, "voice": VOICE, "seed": SEED}
    with (
        tempfile.TemporaryDirectory(prefix="werk-bench-speech-") as scratch,
        Direct(python, model, threads=args.threads) as synth,
    ):
        home = Path(scratch) / "home"
        home.mkdir()
        env = {"WERK_QWEN_TTS_PYTHON": python}
        subprocess.run(
            [sys.executable, "-m", "werk_host", "models", "add", MODEL, str(model)],
            check=True,
            capture_output=True,
            env={**os.environ, **env, "WERK_HOME": str(home)},
        )
        serve_args = ("--model", MODEL, "--backend-option", f"qwen-tts.threads={args.threads}")
        with serve_process(home, *serve_args, keys=(KEY,), env=env) as served:
            api = Api(served.url, KEY, timeout=600)
            first = _speech(api)
            second = _speech(api)
            for _ in range(args.warmup):
                _speech(api)
                synth(body)
            # alternate the sides so that drift in the machine's speed hits them alike
            sync: list[float] = []
            jobs: list[float] = []
            direct_times: list[float] = []
            for _ in range(args.runs):
                direct_times.append(float(synth(body)["synth_s"]))
                sync.append(_speech(api))
                jobs.append(_job(api, args.poll_ms / 1000))
    p50 = statistics.median
    runs = len(direct_times)
    print(f"direct (the package in the engine interpreter): p50 {p50(direct_times) * 1000:.1f} ms over {runs}")
    print(f"/v1/audio/speech (warm):                        p50 {p50(sync) * 1000:.1f} ms over {len(sync)}")
    print(f"job, submitted and polled every {args.poll_ms:g} ms:         p50 {p50(jobs) * 1000:.1f} ms")
    print(f"first request (the model's load into the worker): {first * 1000:.0f} ms; second: {second * 1000:.0f} ms")
    print(f"RATIO speech_vs_direct = {p50(sync) / p50(direct_times):.3f} (target <= 1.10)")
    print(f"RATIO speech_job_added_ms = {(p50(jobs) - p50(sync)) * 1000:.1f} (target <= 50 ms p50)")
    print(f"RATIO speech_first_vs_second = {first / second:.2f} (printed: the model's load)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
