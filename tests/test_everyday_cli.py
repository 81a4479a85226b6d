"""``werk models`` and ``werk deployments`` as a person types them (docs/cli.md): text by
default, ``--json`` for scripts, one error line with the fix and the documented exit codes.

``werk models`` runs against a real ``WERK_HOME``; ``werk deployments`` against a real keyed
``werk serve`` (the reference backend, served over HTTP) and a port where nothing listens.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from werk_host.cli import main
from werk_host.testing.hosts import LiveHost
from werk_host.testing.pytest_plugin import WerkServerFactory
from werk_host.testing.reference import BACKEND_ID, MemoryBackendPlugin


def werk(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_models_alone_lists_a_table_and_add_rm_say_what_happened(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = ["--home", str(tmp_path / "home")]
    weights = tmp_path / "demo.gguf"
    weights.write_bytes(b"GGUF" + b"\0" * (98_000_000 - 4))
    code, out, err = werk(capsys, "models", *home)
    assert (code, out, err) == (0, "no models registered (add one with: werk models add NAME FILE.gguf)\n", "")

    code, out, _ = werk(capsys, "models", "add", "demo", str(weights), "--backend", "llama.cpp", *home)
    assert code == 0
    assert out == "added model 'demo' (llama.cpp, 98 MB) — serve it with: werk serve --model demo\n"
    werk(capsys, "models", "add", "two", str(weights), str(weights), "--param", "max_output_tokens=512", *home)

    for argv in (["models", *home], ["models", "list", *home], ["models", *home, "list"]):
        code, out, _ = werk(capsys, *argv)
        lines = [line.split("  ") for line in out.splitlines()]
        assert code == 0 and [[c.strip() for c in line if c.strip()] for line in lines] == [
            ["NAME", "BACKEND", "FILES/SIZE", "PARAMS"],
            ["demo", "llama.cpp", "98 MB", "-"],
            ["two", "any", "2 files, 196 MB", "max_output_tokens=512"],
        ], out
    code, out, _ = werk(capsys, "models", "--json", *home)
    assert code == 0 and [m["name"] for m in json.loads(out)] == ["demo", "two"]

    code, out, _ = werk(capsys, "models", "rm", "demo", *home)
    assert (code, out) == (0, "removed model 'demo' (its files stay where they are)\n")
    code, out, err = werk(capsys, "models", "rm", "demo", *home)
    assert (code, out, err) == (1, "", "werk: no model named 'demo' (see the registered names with: werk models)\n")
    code, out, _ = werk(capsys, "models", "rm", "demo", "--json", *home)
    assert code == 1 and json.loads(out) == {"name": "demo", "removed": False}


@pytest.mark.parametrize(
    ("argv", "status", "line"),
    [
        (
            ["add", "bad name", "{file}"],
            2,
            "werk: model names use letters, digits, '.', '_' and '-' (pick another NAME",
        ),
        (["add", "x", "{dir}/missing.gguf"], 1, "werk: model file not found: missing.gguf (check the path)"),
        (["add", "x", "{file}", "--param", "oops"], 2, "werk: expected KEY=VALUE, got 'oops' (pass --param KEY=VALUE)"),
    ],
)
def test_models_errors_are_one_line_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], status: int, line: str
) -> None:
    weights = tmp_path / "m.gguf"
    weights.write_bytes(b"GGUF")
    args = [a.format(file=weights, dir=tmp_path) for a in argv]
    code, out, err = werk(capsys, "models", *args, "--home", str(tmp_path / "home"))
    assert (code, out) == (status, "") and err.startswith(line) and err.count("\n") == 1, err
    code, out, err = werk(capsys, "models", *args, "--home", str(tmp_path / "home"), "--json")
    assert code == status and json.loads(err)["error"]["message"], err


@pytest.fixture
def served(werk_server: WerkServerFactory) -> LiveHost:
    return werk_server(MemoryBackendPlugin())


def closed_port() -> int:
    """A local port where nothing listens (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_deployments_prints_a_table_and_fails_in_one_line(
    served: LiveHost, werk_api_key: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = served.url.removeprefix("http://")
    monkeypatch.setenv("WERK_API_KEY", werk_api_key)
    code, out, _ = werk(capsys, "deployments", "--server", bare)
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:3] == ["ID", "BACKEND", "MODEL"] and BACKEND_ID in lines[1]

    monkeypatch.delenv("WERK_API_KEY")
    code, out, err = werk(capsys, "deployments", "--server", served.url)
    assert (code, out) == (22, "")
    assert err == f"werk: the server at {served.url} requires an API key (set WERK_API_KEY)\n"
    monkeypatch.setenv("WERK_API_KEY", "sk-not-its-key-0000")
    code, out, err = werk(capsys, "deployments", "--server", served.url)
    assert code == 22 and err.count("\n") == 1 and "did not accept the API key in WERK_API_KEY" in err
    assert "sk-not-its-key" not in err
    code, out, err = werk(capsys, "deployments", "--server", served.url, "--json")
    assert code == 22 and json.loads(err)["error"]["status"] == 401  # scripts get the error object

    port = closed_port()
    code, out, err = werk(capsys, "deployments", "--server", f"127.0.0.1:{port}")
    assert (code, out) == (3, "")
    assert err == (
        f"werk: cannot reach werk serve at http://127.0.0.1:{port} "
        "(start it with `werk serve`, or pass --server URL or set WERK_SERVER)\n"
    )


def test_deployments_help_names_the_server_and_key_variables(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["deployments", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "$WERK_API_KEY" in text and "$WERK_SERVER" in text and "exit status" in text
