"""The image and speech nodes against a real ``werk serve`` with the media workers, run in
the engine's interpreter (which has torch, as ComfyUI's has): the ``IMAGE`` tensor is the
job's PNG, the ``AUDIO`` waveform the job's WAV, and the polling reported progress."""

from __future__ import annotations

import io
import json
import os
import subprocess
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from werk_host.client import WerkProtocolClient
from werk_host.testing.api import Api
from werk_host.testing.hosts import ServeProcess

pytestmark = pytest.mark.engine
HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent
REPO = PACKAGE.parents[1]


def _run_graph(prompt: dict[str, Any], tmp_path: Path, key_env: str) -> dict[str, Any]:
    python = os.environ["WERK_DIFFUSERS_PYTHON"]
    (tmp_path / "prompt.json").write_text(json.dumps(prompt))
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE)])}
    done = subprocess.run(
        [python, str(HERE / "run_graph.py"), str(PACKAGE), str(tmp_path / "prompt.json"), str(tmp_path)],
        capture_output=True,
        text=True,
        env=environ,
        timeout=600,
        check=False,
    )
    shown: dict[str, Any] = (
        json.loads((tmp_path / "outputs.json").read_text()) if (tmp_path / "outputs.json").exists() else {}
    )
    assert done.returncode == 0, (shown, done.stderr[-3000:])
    return shown


def _connection(server: ServeProcess, key_env: str) -> dict[str, Any]:
    inputs = {"base_url": server.url, "api_key_source": "environment", "api_key_env": key_env}
    return {"class_type": "WerkConnection", "inputs": inputs | {"api_key_file": "", "timeout_s": 300.0}}


def test_the_image_node_answers_the_job_s_png_as_an_image_tensor(
    media_server: ServeProcess, key_env: str, key: str, tmp_path: Path
) -> None:
    image = {"prompt": "a lighthouse", "negative_prompt": "", "width": 64, "height": 64, "steps": 4}
    image |= {"guidance_scale": 7.0, "seed": 42, "batch_size": 2, "timeout_s": 600.0, "model": "tiny-sd"}
    prompt = {
        "1": _connection(media_server, key_env),
        "2": {"class_type": "WerkImage", "inputs": {**image, "connection": ["1", 0]}},
    }
    shown = _run_graph(prompt, tmp_path, key_env)
    tensor = np.load(tmp_path / "2-0.npy")
    assert tensor.shape == (2, 64, 64, 3) and tensor.dtype == np.float32
    client = WerkProtocolClient(media_server.url, key)
    job = client.job(shown["2-1"])
    assert [f.name for f in job.results] == ["image-0.png", "image-1.png"]
    for index, item in enumerate(job.results):
        png, content_type = client.job_result(job.id, item.name)
        assert content_type == "image/png"
        expected = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.float32) / 255.0
        assert np.array_equal(tensor[index], expected)
    assert shown["progress"] and shown["progress"][-1] == [100, 100]


def test_the_speech_node_answers_the_job_s_wav_as_audio(
    media_server: ServeProcess, key_env: str, key: str, tmp_path: Path
) -> None:
    speech = {"text": "Hello from Werk.", "voice": "alice", "seed": 7, "timeout_s": 600.0, "model": "tiny-tts"}
    prompt = {
        "1": _connection(media_server, key_env),
        "2": {"class_type": "WerkSpeech", "inputs": {**speech, "connection": ["1", 0]}},
    }
    shown = _run_graph(prompt, tmp_path, key_env)
    waveform = np.load(tmp_path / "2-0.npy")
    client = WerkProtocolClient(media_server.url, key)
    job = client.job(shown["2-1"])
    wav, content_type = client.job_result(job.id, job.results[0].name)
    assert content_type == "audio/wav"
    with wave.open(io.BytesIO(wav)) as reader:
        rate, frames = reader.getframerate(), reader.readframes(reader.getnframes())
    samples = np.frombuffer(frames, dtype="<i2").astype(np.float32) / 32768.0
    assert shown["2-0"]["sample_rate"] == rate
    assert waveform.shape == (1, 1, samples.size) and samples.size > 0
    assert np.array_equal(waveform[0, 0], samples)


def test_a_refused_speech_input_is_a_node_error_before_any_job(
    media_server: ServeProcess, key_env: str, key: str, tmp_path: Path
) -> None:
    speech = {"text": "x" * 4097, "voice": "alice", "seed": 7, "timeout_s": 60.0, "model": "tiny-tts"}
    prompt = {
        "1": _connection(media_server, key_env),
        "2": {"class_type": "WerkSpeech", "inputs": {**speech, "connection": ["1", 0]}},
    }
    jobs = Api(media_server.url, key)
    before = jobs.get("/werk/v1/jobs")[1]["data"]
    (tmp_path / "prompt.json").write_text(json.dumps(prompt))
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE)])}
    done = subprocess.run(
        [
            os.environ["WERK_DIFFUSERS_PYTHON"],
            str(HERE / "run_graph.py"),
            str(PACKAGE),
            str(tmp_path / "prompt.json"),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=environ,
        timeout=300,
        check=False,
    )
    assert done.returncode == 1
    errors = json.loads((tmp_path / "outputs.json").read_text())["node_errors"]["2"]
    assert "text" in errors[0]["message"] and "Fix:" in errors[0]["message"]
    assert jobs.get("/werk/v1/jobs")[1]["data"] == before
