"""The real engine through the speech routes of a real ``werk serve``: the tiny model registered
with ``werk models add``, then the official ``openai`` SDK's ``client.audio.speech.create`` and
a native ``kind: speech`` job each give the samples the package gives called directly
(werk_qwen_tts.testing.models.direct); bad input is a 400 in OpenAI's shape; a worker killed
mid-synthesis fails that request (503) or that job and the next one succeeds, while the
generic media worker (diffusers, where its engine is set up) is untouched; the kit's speech
conformance suite passes."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from werk_qwen_tts.testing.models import direct

from werk_host.testing.api import Api
from werk_host.testing.conformance_target import ConformanceTarget
from werk_host.testing.engines import engine_python
from werk_host.testing.hosts import serve_process
from werk_host.testing.markers import covers_hooks
from werk_host.testing.speech_conformance import SpeechConformance

pytestmark = pytest.mark.engine

KEY = "sk-qwen-tts-serve"
MODEL = "tiny-tts"
SHORT = "Hello world."
LONG = "Hello world. This is a considerably longer sentence, so that the audio must grow with it."


def _werk(home: Path, env: dict[str, str], *args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "werk_host", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "WERK_HOME": str(home), **env},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, engine: str, model: Path) -> Iterator[str]:
    home = tmp_path_factory.mktemp("qwen-serve") / "home"
    home.mkdir()
    env = {"WERK_QWEN_TTS_PYTHON": engine}
    _werk(home, env, "models", "add", MODEL, str(model))
    with serve_process(home, "--model", MODEL, "--backend-option", "qwen-tts.threads=1", keys=(KEY,), env=env) as proc:
        yield proc.url


def _post(url: str, body: dict[str, Any]) -> tuple[int, bytes, str]:
    request = urllib.request.Request(
        url + "/v1/audio/speech",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as answer:
            return answer.status, answer.read(), answer.headers.get("Content-Type", "")
    except urllib.error.HTTPError as err:
        return err.code, err.read(), err.headers.get("Content-Type", "")


def _get(url: str) -> bytes:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        data: bytes = answer.read()
        return data


def _wav(data: bytes) -> tuple[int, bytes]:
    with wave.open(io.BytesIO(data)) as reader:
        assert reader.getnchannels() == 1 and reader.getsampwidth() == 2
        return reader.getframerate(), reader.readframes(reader.getnframes())


def _finished(api: Api, job_id: str, timeout: float = 300.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while (view := api.get(f"/werk/v1/jobs/{job_id}")[1]["data"])["status"] in ("queued", "running"):
        assert time.monotonic() < deadline, view
        time.sleep(0.05)
    result: dict[str, Any] = view
    return result


def _worker_pid(api: Api, backend: str) -> int:
    workers = api.get("/werk/v1/observability")[1]["data"]["workers"]
    (pid,) = {w["pid"] for w in workers if w["backend"] == backend}
    return int(pid)


@covers_hooks("werk_speech_synthesis", "werk_speech_limits")
def test_the_openai_sdk_gets_the_package_s_own_samples(served: str, engine: str, model: Path) -> None:
    import openai

    client = openai.OpenAI(base_url=served + "/v1", api_key=KEY)
    answer = client.audio.speech.create(
        model=MODEL, voice="alice", input=SHORT, response_format="wav", extra_body={"seed": 7}
    )
    assert answer.response.headers["content-type"] == "audio/wav"
    rate, pcm = _wav(answer.content)
    expected = direct(engine, model, {"input": SHORT, "voice": "alice", "seed": 7})
    assert rate == expected["sample_rate"] == 24000
    assert pcm == expected["pcm"] and len(pcm) > 0
    longer = client.audio.speech.create(
        model=MODEL, voice="alice", input=LONG, response_format="wav", extra_body={"seed": 7}
    )
    assert len(_wav(longer.content)[1]) > len(pcm)
    styled = client.audio.speech.create(
        model=MODEL, voice="bob", input=SHORT, instructions="slowly", response_format="wav", extra_body={"seed": 7}
    )
    assert (
        _wav(styled.content)[1]
        == direct(engine, model, {"input": SHORT, "voice": "bob", "seed": 7, "instructions": "slowly"})["pcm"]
    )
    default = client.audio.speech.create(model=MODEL, voice="alice", input=SHORT, extra_body={"seed": 7})
    assert default.response.headers["content-type"] == "audio/mpeg" and default.content


def test_a_speech_job_s_file_is_the_package_s_own_samples(served: str, engine: str, model: Path) -> None:
    api = Api(served, KEY)
    fields = {"input": SHORT, "voice": "alice", "seed": 11, "response_format": "wav"}
    status, doc = api.post("/werk/v1/jobs", {"kind": "speech", "model": MODEL, "input": fields})
    assert status == 202, doc
    view = _finished(api, doc["data"]["id"])
    assert view["status"] == "succeeded" and view["info"]["sample_rate"] == 24000, view
    data = _get(f"{served}/werk/v1/jobs/{view['id']}/result/speech.wav")
    assert _wav(data)[1] == direct(engine, model, {"input": SHORT, "voice": "alice", "seed": 11})["pcm"]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"input": "hi", "voice": "alloy"}, "alice, bob"),
        ({"input": "hi", "voice": "alice", "speed": 1.5}, "speed"),
        ({"input": "hi", "voice": "alice", "response_format": "opus"}, "response_format"),
        ({"input": "", "voice": "alice"}, "input"),
        ({"input": "x" * 4097, "voice": "alice"}, "input"),
        ({"input": "hi", "voice": "alice", "language": "klingon"}, "english"),
    ],
)
def test_bad_input_is_a_400_in_openai_s_shape(served: str, body: dict[str, Any], named: str) -> None:
    status, data, _type = _post(served, {"model": MODEL, **body})
    assert status == 400, data
    error = json.loads(data)["error"]
    assert named in error["message"] and error["type"] == "invalid_request_error"


def test_a_worker_killed_mid_synthesis_fails_that_request_and_that_job_only(served: str) -> None:
    api = Api(served, KEY)
    assert _post(served, {"model": MODEL, "input": SHORT, "voice": "alice"})[0] == 200
    answers: list[tuple[int, bytes, str]] = []
    thread = threading.Thread(
        target=lambda: answers.append(_post(served, {"model": MODEL, "input": LONG * 8, "voice": "alice"}))
    )
    thread.start()
    time.sleep(1.0)  # inside the synthesis (a long input takes many seconds on the tiny model)
    os.killpg(_worker_pid(api, "qwen-tts"), signal.SIGKILL)
    thread.join(300)
    ((status, data, _type),) = answers
    assert status == 503, data
    assert "error" in json.loads(data)
    assert _post(served, {"model": MODEL, "input": SHORT, "voice": "alice"})[0] == 200
    status, doc = api.post(
        "/werk/v1/jobs", {"kind": "speech", "model": MODEL, "input": {"input": LONG * 8, "voice": "alice"}}
    )
    assert status == 202, doc
    job_id = doc["data"]["id"]
    deadline = time.monotonic() + 120
    while api.get(f"/werk/v1/jobs/{job_id}")[1]["data"]["progress"]["step"] < 3:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pid = _worker_pid(api, "qwen-tts")
    os.killpg(pid, signal.SIGKILL)
    view = _finished(api, job_id)
    assert view["status"] == "failed" and view["error"]["code"] == "unavailable", view
    assert str(pid) not in view["error"]["message"]
    again = api.post("/werk/v1/jobs", {"kind": "speech", "model": MODEL, "input": {"input": SHORT, "voice": "alice"}})
    assert _finished(api, again[1]["data"]["id"])["status"] == "succeeded"


TWO_WORKERS = """
[[instance]]
id = "tts"
model = "tiny-tts"
default = true

[[instance]]
id = "sd"
model = "tiny-sd"
"""


def test_the_generic_media_worker_is_untouched_when_the_qwen_worker_dies(
    tmp_path: Path, engine: str, model: Path
) -> None:
    diffusers_python = engine_python("WERK_DIFFUSERS_PYTHON")
    testing = pytest.importorskip("werk_diffusers.testing", reason="werk-diffusers is not installed")
    if diffusers_python is None:
        pytest.skip("WERK_DIFFUSERS_PYTHON names no engine interpreter (scripts/setup-engine-venv.sh diffusers)")
    home = tmp_path / "home"
    home.mkdir()
    env = {"WERK_QWEN_TTS_PYTHON": engine, "WERK_DIFFUSERS_PYTHON": diffusers_python}
    _werk(home, env, "models", "add", "tiny-tts", str(model))
    _werk(home, env, "models", "add", "tiny-sd", str(testing.tiny_pipeline(diffusers_python)))
    profile = tmp_path / "deployments.toml"
    profile.write_text(TWO_WORKERS)
    with serve_process(home, "--profile", str(profile), keys=(KEY,), env=env) as proc:
        api = Api(proc.url, KEY)
        image = {"model": "sd", "prompt": "a lighthouse", "size": "64x64", "steps": 4, "seed": 3}
        status, first = api.post("/v1/images/generations", image)
        assert status == 200, first
        sd_pid = _worker_pid(api, "diffusers")
        assert _post(proc.url, {"model": "tts", "input": SHORT, "voice": "alice"})[0] == 200  # both workers live
        answers: list[tuple[int, bytes, str]] = []
        body = {"model": "tts", "input": LONG * 8, "voice": "alice"}
        thread = threading.Thread(target=lambda: answers.append(_post(proc.url, body)))
        thread.start()
        time.sleep(1.0)
        os.killpg(_worker_pid(api, "qwen-tts"), signal.SIGKILL)
        thread.join(300)
        assert answers[0][0] == 503
        status, again = api.post("/v1/images/generations", image)
        assert status == 200 and again["data"] == first["data"]
        assert _worker_pid(api, "diffusers") == sd_pid
        assert _post(proc.url, {"model": "tts", "input": SHORT, "voice": "alice"})[0] == 200


class TestQwenSpeechConformance(SpeechConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, engine: str, model: Path) -> ConformanceTarget:
        return ConformanceTarget(
            entry_point="qwen-tts",
            model=model,
            model_name=MODEL,
            backend_options={"qwen-tts": {"python": engine, "threads": 1}},
        )
