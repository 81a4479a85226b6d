"""Schemathesis against the served OpenAPI document: every check, bounded examples.

The server is a real waitress host over the in-memory test adapter; schemathesis reads the
bare document from ``GET /openapi.json`` and sends generated valid and invalid requests to
every ``/werk/v1`` operation. Statuses the protocol documents for deliberate refusals are
listed, with their reasons, in tests/schemathesis.toml; anything else fails the test (a 500
above all). ``WERK_FUZZ_EXAMPLES`` raises the number of examples per operation.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import KEY
from werk_host.testing.hosts import backend_host, running

CONFIG = Path(__file__).with_name("schemathesis.toml")
EXAMPLES = int(os.environ.get("WERK_FUZZ_EXAMPLES", "25"))


def _schemathesis() -> str:
    found = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or shutil.which("schemathesis")
    if found is None:
        pytest.fail("schemathesis is not installed: it is part of the test extra (scripts/setup.sh installs it)")
    return found


def test_schemathesis_finds_no_undocumented_status(home: Path, tmp_path: Path) -> None:
    host, _ = backend_host(home, api_keys=(KEY,))
    try:
        with running(host) as base:
            result = subprocess.run(
                [
                    _schemathesis(),
                    "--config-file",
                    str(CONFIG),
                    "run",
                    f"{base}/openapi.json",
                    "--header",
                    f"Authorization: Bearer {KEY}",
                    "--max-examples",
                    str(EXAMPLES),
                    "--seed",
                    "20261130",
                    "--workers",
                    "1",
                    "--request-timeout",
                    "30",
                ],
                capture_output=True,
                text=True,
                timeout=900,
                cwd=tmp_path,  # schemathesis may write reports next to where it runs
                env={**os.environ, "SCHEMATHESIS_HOOKS": ""},
            )
    finally:
        host.close()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    counts = re.search(r"(\d+) generated, (\d+) passed", output)
    assert counts is not None and int(counts.group(2)) >= 10 * EXAMPLES, output[-2000:]
    assert KEY not in output
