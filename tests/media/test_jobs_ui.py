"""The operator page's Jobs view (werk_host/ui/static/jobs.js, docs/ui.md) in real headless
Chromium over a served host with the reference media backend: a key sees its own jobs with
their progress, cancels a running one, and sees a finished job's images; another key's jobs
never appear."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser_support import chromium
from tests.test_ui import _click, _no_page_errors, _sign_in, _text, _wait

from .support import KEY_A, KEY_B, finished, media_host, running, speech_host


@pytest.fixture(scope="module")
def chrome() -> Iterator[Any]:
    yield from chromium("--window-size=1360,900")


def test_the_jobs_view_lists_cancels_and_shows_a_key_s_own_jobs(chrome: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    with media_host(tmp_path / "home", params={"step_delay_s": 0.05}) as (live, _plugin):
        fields = {"prompt": "ui", "width": 64, "height": 64, "steps": 2, "n": 2}
        done = live.api.post("/werk/v1/jobs", {"kind": "image", "input": fields})[1]["data"]["id"]
        finished(live.api, done)
        other = live.api.as_key(KEY_B).post("/werk/v1/jobs", {"kind": "image", "input": fields})[1]["data"]["id"]
        slow = live.api.post("/werk/v1/jobs", {"kind": "image", "input": {**fields, "steps": 150}})[1]["data"]["id"]
        running(live.api, slow)
        url = live.url.replace("127.0.0.1", "localhost")
        _sign_in(chrome, url, KEY_A, "jobs")
        _wait(
            chrome,
            lambda d: d.find_elements(By.CSS_SELECTOR, f'tr[data-job="{slow}"] [data-action="cancel"]'),
            "the running job",
        )
        table = _text(chrome, "#jobs-table")
        assert done in table and slow in table and other not in table
        _click(chrome, f'tr[data-job="{slow}"] [data-action="cancel"]')
        assert finished(live.api, slow, timeout=10)["status"] == "cancelled"
        _wait(chrome, lambda d: "cancelled" in _text(d, f'tr[data-job="{slow}"]'), "the cancelled status")
        _click(chrome, f'tr[data-job="{done}"] [data-action="show"]')
        _wait(chrome, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#jobs-images img.job-image")) == 2, "two images")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            widths = chrome.execute_script(
                "return [...document.querySelectorAll('#jobs-images img')].map((i) => i.naturalWidth)"
            )
            if widths == [64, 64]:
                break
            time.sleep(0.1)
        assert widths == [64, 64]
        _no_page_errors(chrome)


def test_the_jobs_view_plays_a_speech_job_s_audio(chrome: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    chrome.get("about:blank")  # the previous test's page polled its host as it stopped:
    chrome.get_log("browser")  # those refused connections are not this test's
    with speech_host(tmp_path) as (live, _speech, _media):
        fields = {"input": "a sentence for the page", "seed": 5}
        done = live.api.post("/werk/v1/jobs", {"kind": "speech", "input": fields})[1]["data"]["id"]
        view = finished(live.api, done)
        assert view["status"] == "succeeded"
        url = live.url.replace("127.0.0.1", "localhost")
        _sign_in(chrome, url, KEY_A, "jobs")
        _wait(
            chrome, lambda d: d.find_elements(By.CSS_SELECTOR, f'tr[data-job="{done}"] [data-action="show"]'), "the job"
        )
        assert "speech" in _text(chrome, f'tr[data-job="{done}"]')
        _click(chrome, f'tr[data-job="{done}"] [data-action="show"]')
        _wait(chrome, lambda d: d.find_elements(By.CSS_SELECTOR, "#jobs-images audio.job-audio"), "the audio player")
        deadline = time.monotonic() + 10
        duration = None
        while time.monotonic() < deadline:
            duration = chrome.execute_script(
                "const a = document.querySelector('#jobs-images audio'); return a.readyState >= 1 ? a.duration : null"
            )
            if duration:
                break
            time.sleep(0.1)
        assert duration == pytest.approx(view["info"]["seconds"], abs=0.01)
        _no_page_errors(chrome)
