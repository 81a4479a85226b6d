"""OpenAI's ``/v1/audio/speech`` and ``kind: speech`` jobs over a real served host
(docs/media.md, "Speech"), against the reference speech backend (werk_host/testing/speech.py)
beside the reference media backend: the official ``openai`` SDK, raw HTTP for bad input and
jobs, isolation between keys, cancellation, a worker that dies mid-synthesis."""

from __future__ import annotations

import io
import json
import threading
import wave
from pathlib import Path
from typing import Any

import openai
import pytest

from werk_host.protocol.speech import MAX_SPEECH_CHARS, SpeechRequest
from werk_host.testing.hosts import install_model, serving
from werk_host.testing.media import MEDIA_BACKEND, ReferenceMediaPlugin
from werk_host.testing.speech import SAMPLE_RATE, SAMPLES_PER_CHAR, reference_samples, wav_bytes

from .support import KEY_A, KEY_B, fetch, finished, running, speech_host


def exact(text: str, seed: int, *, voice: str = "alloy", fmt: str = "wav", **fields: object) -> SpeechRequest:
    """The request the host runs for these fields (the reference backend's defaults filled in)."""
    return SpeechRequest.model_validate({"input": text, "voice": voice, "response_format": fmt, "seed": seed, **fields})


def frames(wav: bytes) -> tuple[int, int, bytes]:
    """A WAV file's sample rate, sample count and samples."""
    with wave.open(io.BytesIO(wav)) as reader:
        assert reader.getnchannels() == 1 and reader.getsampwidth() == 2
        return reader.getframerate(), reader.getnframes(), reader.readframes(reader.getnframes())


def test_openai_speech_answers_the_backend_s_own_audio_deterministically(tmp_path: Path) -> None:
    with speech_host(tmp_path) as (live, speech, _media):
        client = openai.OpenAI(base_url=live.url + "/v1", api_key=KEY_A)
        first = client.audio.speech.create(
            model="voice", voice="alloy", input="Hello there.", response_format="wav", extra_body={"seed": 7}
        )
        assert first.response.headers["content-type"] == "audio/wav"
        again = client.audio.speech.create(
            model="voice", voice="alloy", input="Hello there.", response_format="wav", extra_body={"seed": 7}
        )
        assert first.content == again.content == wav_bytes(reference_samples(exact("Hello there.", 7)), SAMPLE_RATE)
        rate, count, _samples = frames(first.content)
        assert rate == SAMPLE_RATE and count == len("Hello there.") * SAMPLES_PER_CHAR
        longer = client.audio.speech.create(
            model="voice", voice="alloy", input="Hello there, and a good deal more.", extra_body={"seed": 7}
        )
        assert frames(longer.content)[1] > count
        other = client.audio.speech.create(
            model="voice", voice="alloy", input="Hello there.", response_format="wav", extra_body={"seed": 8}
        )
        assert other.content != first.content
        assert speech.adapters[0].runs == 4


def test_speech_formats_voices_and_languages_come_out_exact(tmp_path: Path) -> None:
    with speech_host(tmp_path) as (live, _speech, _media):
        body = {"model": "voice", "input": "pcm please", "voice": "NOVA", "response_format": "pcm", "seed": 3}
        status, data, content_type = fetch(live.url + "/v1/audio/speech", KEY_A, method="POST", body=body)
        assert (status, content_type) == (200, "audio/pcm")
        assert data == reference_samples(exact("pcm please", 3, voice="Nova", fmt="pcm"))
        body = {"input": "defaults", "seed": 1, "language": "English", "instructions": "calmly"}
        status, data, content_type = fetch(live.url + "/v1/audio/speech", KEY_A, method="POST", body=body)
        assert (status, content_type) == (200, "audio/wav")
        expected = exact("defaults", 1, language="english", instructions="calmly")
        assert data == wav_bytes(reference_samples(expected), SAMPLE_RATE)
        status, data, _type = fetch(
            live.url + "/v1/audio/speech", KEY_A, method="POST", body={"input": "x", "speed": 1}
        )
        assert status == 200 and data.startswith(b"RIFF")


BAD = [
    ({"input": ""}, "input"),
    ({"input": "x" * (MAX_SPEECH_CHARS + 1)}, "input"),
    ({}, "input"),
    ({"input": "hi", "voice": "ash"}, "unknown voice"),
    ({"input": "hi", "response_format": "mp3"}, "response_format"),
    ({"input": "hi", "response_format": "opus"}, "response_format"),
    ({"input": "hi", "speed": 2.0}, "speed"),
    ({"input": "hi", "speed": 0.1}, "speed"),
    ({"input": "hi", "speed": "fast"}, "speed"),
    ({"input": "hi", "language": "klingon"}, "language"),
    ({"input": "hi", "stream_format": "sse"}, "stream_format"),
    ({"input": "hi", "seed": -1}, "seed"),
    ({"input": "hi", "volume": 11}, "volume"),
    ({"input": 5}, "input"),
    ({"input": "hi", "model": "pix"}, "does not synthesize speech"),
    ({"input": "hi", "model": "nope"}, "nope"),
]


@pytest.mark.parametrize(("body", "named"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_speech_input_is_a_typed_openai_4xx_before_any_work(
    tmp_path: Path, body: dict[str, Any], named: str
) -> None:
    with speech_host(tmp_path) as (live, speech, media):
        status, data, _type = fetch(live.url + "/v1/audio/speech", KEY_A, method="POST", body=body)
        assert 400 <= status < 500 or status == 501, (status, data)
        error = json.loads(data)["error"]
        assert named in error["message"] and isinstance(error["type"], str)
        assert "x" * 100 not in error["message"]
        job = live.api.post("/werk/v1/jobs", {"kind": "speech", "input": body})
        assert 400 <= job[0] < 500 or job[0] == 501, job
        assert live.api.get("/werk/v1/jobs")[1]["data"] == []
        assert sum(a.runs for a in speech.adapters) == 0 and sum(a.runs for a in media.adapters) == 0


def test_a_speech_job_runs_to_a_file_that_only_its_owner_reads(tmp_path: Path) -> None:
    with speech_host(tmp_path) as (live, _speech, _media):
        fields = {"input": "as a job", "voice": "alloy", "seed": 11}
        status, doc = live.api.post("/werk/v1/jobs", {"kind": "speech", "model": "voice", "input": fields})
        assert status == 202, doc
        view = finished(live.api, doc["data"]["id"])
        assert view["status"] == "succeeded" and view["kind"] == "speech" and view["model"] == "voice"
        assert [r["name"] for r in view["results"]] == ["speech.wav"]
        assert view["info"]["seed"] == 11 and view["info"]["sample_rate"] == SAMPLE_RATE
        url = f"{live.url}/werk/v1/jobs/{view['id']}/result/speech.wav"
        status, data, content_type = fetch(url, KEY_A)
        assert (status, content_type) == (200, "audio/wav")
        assert data == wav_bytes(reference_samples(exact("as a job", 11)), SAMPLE_RATE)
        assert fetch(url, KEY_B)[0] == 404
        assert live.api.as_key(KEY_B).get(f"/werk/v1/jobs/{view['id']}")[0] == 404
        assert live.api.as_key(KEY_B).get("/werk/v1/jobs")[1]["data"] == []
        assert fetch(url, None)[0] == 401
        assert fetch(live.url + "/v1/audio/speech", None, method="POST", body={"input": "hi"})[0] == 401


def test_a_running_speech_job_is_cancelled_and_the_host_goes_on(tmp_path: Path) -> None:
    with speech_host(tmp_path) as (live, _speech, _media):
        job = live.api.post("/werk/v1/jobs", {"kind": "speech", "model": "slowvoice", "input": {"input": "slow"}})
        job_id = job[1]["data"]["id"]
        assert running(live.api, job_id)["progress"]["steps"] == 4
        assert live.api.post(f"/werk/v1/jobs/{job_id}/cancel", {})[0] == 200
        assert finished(live.api, job_id)["status"] == "cancelled"
        assert fetch(live.url + "/v1/audio/speech", KEY_A, method="POST", body={"input": "next"})[0] == 200


def test_a_worker_dying_mid_synthesis_fails_that_request_and_job_only(tmp_path: Path) -> None:
    with speech_host(tmp_path) as (live, speech, media):
        speech.fail_after = 1
        status, data, _type = fetch(live.url + "/v1/audio/speech", KEY_A, method="POST", body={"input": "dies"})
        assert status == 503, data
        assert "error" in json.loads(data)
        status, data, _type = fetch(live.url + "/v1/audio/speech", KEY_A, method="POST", body={"input": "lives"})
        assert status == 200 and data.startswith(b"RIFF")
        speech.fail_after = 2
        job_id = live.api.post("/werk/v1/jobs", {"kind": "speech", "input": {"input": "dies"}})[1]["data"]["id"]
        failed = finished(live.api, job_id)
        assert failed["status"] == "failed" and failed["error"]["code"] == "unavailable"
        job_id = live.api.post("/werk/v1/jobs", {"kind": "speech", "input": {"input": "lives"}})[1]["data"]["id"]
        assert finished(live.api, job_id)["status"] == "succeeded"
        image = live.api.post(
            "/werk/v1/jobs", {"kind": "image", "model": "pix", "input": {"prompt": "p", "width": 64, "height": 64}}
        )
        assert finished(live.api, image[1]["data"]["id"])["status"] == "succeeded"
        assert [a.generation for a in media.adapters] == [0]


def test_keys_racing_speech_each_get_their_own_audio(tmp_path: Path) -> None:
    with speech_host(tmp_path) as (live, _speech, _media):
        answers: dict[tuple[str, int], tuple[int, bytes]] = {}

        def speak(key: str, seed: int) -> None:
            body = {"input": f"key {key} seed {seed}", "seed": seed}
            status, data, _type = fetch(live.url + "/v1/audio/speech", key, method="POST", body=body)
            answers[(key, seed)] = (status, data)

        threads = [threading.Thread(target=speak, args=(k, s)) for k in (KEY_A, KEY_B) for s in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        served = {who for who, (status, _data) in answers.items() if status == 200}
        assert {status for status, _data in answers.values()} <= {200, 429}, answers
        assert {key for key, _seed in served} == {KEY_A, KEY_B}
        for key, seed in served:
            expected = wav_bytes(reference_samples(exact(f"key {key} seed {seed}", seed)), SAMPLE_RATE)
            assert answers[(key, seed)][1] == expected


def test_speech_capabilities_and_no_speech_model(tmp_path: Path) -> None:
    with speech_host(tmp_path) as (live, _speech, _media):
        assert fetch(live.url + "/v1/audio/speech", KEY_A, method="POST", body={"input": "warm"})[0] == 200
        status, data, _type = fetch(live.url + "/werk/v1/capabilities", KEY_A, headers={"X-Werk-Deployment": "voice"})
        assert status == 200, data
        caps = {c["id"]: c["status"] for c in json.loads(data)["data"]}
        assert caps["media.speech.synthesis"] == "supported"
        assert caps["media.speech.streaming"] == "unsupported"
    home = tmp_path / "only-images"
    home.mkdir()
    install_model(home, "pix", backend=MEDIA_BACKEND, params={})
    with serving(home, plugin=ReferenceMediaPlugin(), model="pix", api_keys=(KEY_A,)) as live:
        status, data, _type = fetch(live.url + "/v1/audio/speech", KEY_A, method="POST", body={"input": "hi"})
        assert status == 501 and "no speech model" in json.loads(data)["error"]["message"]


def test_a_cross_site_form_post_to_the_speech_route_is_refused_before_any_work(tmp_path: Path) -> None:
    import urllib.error
    import urllib.request

    with speech_host(tmp_path) as (live, speech, _media):
        request = urllib.request.Request(
            live.url + "/v1/audio/speech",
            data=b'{"input": "a form post"}',
            headers={"Authorization": f"Bearer {KEY_A}", "Content-Type": "text/plain;charset=UTF-8"},
            method="POST",
        )
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=30)
        assert caught.value.code == 415
        assert json.loads(caught.value.read())["error"]["type"] == "invalid_request_error"
        assert sum(a.runs for a in speech.adapters) == 0
