"""One headless Chromium for the browser tests (tests/test_ui.py, tests/test_browser_safety.py),
driven by selenium through the system's ``chromedriver``; skipped, with the reason, where
``scripts/setup-browser.sh`` has not installed them."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")


def chromium(*flags: str, script_timeout_s: float | None = None) -> Iterator[Any]:
    """Yield a headless Chromium with ``flags`` added (and the browser console logged); quit
    after. For a module-scoped fixture: ``yield from chromium(...)``."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("no chromium/chromedriver: run scripts/setup-browser.sh (apt-get, as root)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", *flags):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    if script_timeout_s is not None:
        driver.set_script_timeout(script_timeout_s)
    try:
        yield driver
    finally:
        driver.quit()
