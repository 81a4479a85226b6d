"""``werk serve`` takes keys from files and the environment, never from argv (README,
"Configuration"): argv is readable by every local user in ``/proc/PID/cmdline``, so ``--api-key``
and ``--operator-api-key`` are refused with a pointer to the file and environment options, without
echoing the key; operator keys (``--operator-api-key-file``, ``WERK_OPERATOR_API_KEYS``) are
accepted keys of their own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from werk_host.cli.commands import build_parser
from werk_host.cli.serve import collect_api_keys, collect_operator_keys
from werk_host.testing.api import Api

KEY = "sk-werk-argv-test-0123456789"


@pytest.mark.parametrize(
    ("argv", "pointer"),
    [
        (["--api-key", KEY], "--api-key-file FILE"),
        ([f"--api-key={KEY}"], "WERK_API_KEYS"),
        (["--operator-api-key", KEY], "--operator-api-key-file FILE"),
        ([f"--operator-api-key={KEY}"], "WERK_OPERATOR_API_KEYS"),
    ],
)
def test_a_key_on_the_command_line_is_refused_without_echoing_it(
    argv: list[str], pointer: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["serve", *argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert pointer in err and "never read from the command line" in err
    assert KEY not in err


def test_operator_keys_come_from_their_file_and_variable(tmp_path: Path) -> None:
    keys, operators = tmp_path / "keys", tmp_path / "operators"
    keys.write_text("# clients\nsk-a\n\nsk-b\n")
    operators.write_text("sk-op-1\n")
    args = build_parser().parse_args(["serve", "--api-key-file", str(keys), "--operator-api-key-file", str(operators)])
    environ = {"WERK_API_KEYS": "sk-c, sk-a", "WERK_OPERATOR_API_KEYS": "sk-op-2,"}
    assert collect_api_keys(args, environ) == ("sk-c", "sk-a", "sk-b")
    assert collect_operator_keys(args, environ) == ("sk-op-2", "sk-op-1")


def test_werk_serve_accepts_both_kinds_of_key_and_none_is_in_its_argv(tmp_path: Path) -> None:
    client_key, operator_key = "sk-werk-serve-client-42", "sk-werk-serve-operator-42"
    key_file = tmp_path / "operators"
    key_file.write_text(operator_key + "\n")
    env = {**os.environ, "WERK_HOME": str(tmp_path / "home"), "WERK_API_KEYS": client_key}
    proc = subprocess.Popen(
        [sys.executable, "-m", "werk_host.cli", "serve", "--port", "0", "--operator-api-key-file", str(key_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        base = f"http://127.0.0.1:{json.loads(line)['port']}"
        for key in (client_key, operator_key):
            assert Api(base, key).get("/werk/v1/info")[0] == 200
        assert Api(base, "sk-werk-not-a-key").get("/werk/v1/info")[0] == 401
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert client_key.encode() not in cmdline and operator_key.encode() not in cmdline
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    logs = proc.stderr.read() if proc.stderr else ""
    assert client_key not in logs and operator_key not in logs
