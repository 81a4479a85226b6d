"""``werk doctor``'s candle check (werk_candle_bridge/doctor.py; docs/cli.md, "werk doctor"): the
installed mistralrs, and one whose native library does not load."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from werk_candle_bridge import doctor
from werk_candle_bridge.engine import missing_engine_reason

from werk_host.plugin import DoctorCheck, HostConfig


def test_the_installed_mistralrs_is_ok_with_its_version(tmp_path: Path) -> None:
    (check,) = doctor.checks(HostConfig(home=tmp_path))
    if missing_engine_reason() is None:
        version = importlib.metadata.version("mistralrs")
        status = "ok" if version == doctor.TESTED_VERSION else "warn"
        assert (check.name, check.status) == ("candle.mistralrs", status) and version in check.detail
    else:  # a platform without the engine: said so, with what to do
        assert check.status in ("warn", "fail") and check.fix


def test_a_mistralrs_that_does_not_import_fails_with_the_install_line(tmp_path: Path) -> None:
    planted = tmp_path / "site" / "mistralrs"
    planted.mkdir(parents=True)
    (planted / "__init__.py").write_text("raise ImportError('libmistralrs.so: cannot open shared object file')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(planted.parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "werk_host.cli", "doctor", "--json", "--home", str(tmp_path / "home"), "--port", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    (check,) = [c for c in json.loads(done.stdout)["checks"] if c["name"] == "candle.mistralrs"]
    if (sys.platform, platform.machine()) not in doctor.WHEEL_PLATFORMS:
        assert check["status"] == "warn"
        return
    expected = DoctorCheck(
        "candle.mistralrs",
        "fail",
        "the mistralrs engine is not installed here (libmistralrs.so: cannot open shared object file); it has "
        "wheels for Linux x86_64, macOS arm64 and Windows x86_64 only"
        f" (mistralrs {importlib.metadata.version('mistralrs')} is installed)",
        doctor.INSTALL_FIX,
    )
    assert check == expected.as_dict()
