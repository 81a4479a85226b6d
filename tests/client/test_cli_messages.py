"""What a person reads from ``werk runtime …`` and ``werk deployments`` (docs/cli.md, "Output and
exit codes"): text by default, one error line with the fix, ``HOST:PORT`` taken as ``http://``."""

from __future__ import annotations

import io
import socket
import sys
import threading
from pathlib import Path

import pytest

from tests.client.conftest import LIVE_KEY, Live
from tests.client.rawserver import error_envelope, http, raw_server
from werk_host.cli import main
from werk_host.cli.connection import connection_options


def werk(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


@pytest.fixture
def env(live: Live, monkeypatch: pytest.MonkeyPatch) -> Live:
    monkeypatch.setenv("WERK_SERVER", live.url)
    monkeypatch.setenv("WERK_API_KEY", LIVE_KEY)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    return live


@pytest.fixture
def no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WERK_API_KEY", raising=False)
    monkeypatch.delenv("WERK_SERVER", raising=False)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))


def closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    sock.close()
    return port


# -- text output -------------------------------------------------------------------------
def test_info_prints_key_value_lines(env: Live, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = werk(capsys, "runtime", "info")
    assert rc == 0 and err == ""
    assert "active_backend: test-backend" in out.splitlines()
    assert "protocol:" in out.splitlines() and "  major: 1" in out.splitlines()
    assert not out.lstrip().startswith("{")


def test_capabilities_print_a_table(env: Live, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = werk(capsys, "runtime", "capabilities")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split() == ["CAPABILITY", "STATUS", "OPERATIONS", "DETAIL"]
    row = next(line for line in lines if line.startswith("runtime.experts.residency "))
    assert row.split()[1] == "experimental"


def test_states_and_experts_lists_print_tables(env: Live, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = werk(capsys, "runtime", "states", "list")
    assert (rc, out) == (0, "no states\n")
    handoff = tmp_path / "h"
    rc, out, _ = werk(
        capsys, "runtime", "prefill", "--model", "tiny", "--text", "one two", "--mode", "disk",
        "--allow-experimental", "--handoff-file", str(handoff),
    )  # fmt: skip
    assert rc == 0
    assert f"handoff: [secret handoff written to {handoff}; not shown]" in out.splitlines()
    secret = handoff.read_text().strip()
    assert secret not in out
    state_id = next(line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("state_id: "))

    rc, out, _ = werk(capsys, "runtime", "states", "list")
    header, row = out.splitlines()
    assert header.split() == ["ID", "MODEL", "BACKEND", "TIER", "STATUS", "SIZE", "PINNED", "REUSABLE"]
    assert row.split()[:4] == [state_id, "tiny", "test-backend", "disk"] and row.split()[-2] == "no"

    rc, out, _ = werk(capsys, "runtime", "experts", "list", "--allow-experimental", "--limit", "3")
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "MODEL", "TIER", "SIZE", "HOTNESS", "PINNED"]
    assert len(lines) == 5 and lines[-1].startswith("more: repeat with --cursor ")
    assert all(line.split()[1] == "tiny" for line in lines[1:4])


def test_previews_say_so_and_deployments_print_their_table(env: Live, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = werk(capsys, "runtime", "states", "prune", "--all")
    assert rc == 0 and "dry_run: yes" in out.splitlines()
    assert out.splitlines()[-1] == "preview only: nothing changed; repeat with --execute to act"
    rc, out, _ = werk(capsys, "runtime", "deployments")
    header, row = out.splitlines()
    assert header.split()[:4] == ["ID", "BACKEND", "MODEL", "STATE"]
    assert row.split()[:4] == ["tiny*", "test-backend", "tiny", "ready"]


def test_json_keeps_the_result_document(env: Live, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = werk(capsys, "runtime", "states", "list", "--json")
    assert rc == 0 and out == '{\n  "next_cursor": null,\n  "states": []\n}\n'


def test_a_server_given_as_host_port_is_taken_as_http(
    live: Live, no_key: None, capsys: pytest.CaptureFixture[str]
) -> None:
    host_port = live.url.removeprefix("http://")
    assert host_port != live.url
    rc, _, err = werk(capsys, "runtime", "count-tokens", "--text", "hi", "--server", host_port)
    assert rc == 22, err  # it reached the server, which wants a key
    port = host_port.rsplit(":", 1)[1]
    rc, _, err = werk(capsys, "runtime", "info", "--server", f"localhost:{port}")
    assert rc == 22 and err == f"werk: the server at http://localhost:{port} requires an API key (set WERK_API_KEY)\n"


def test_connection_help_names_the_environment() -> None:
    text = connection_options().format_help()
    assert "WERK_SERVER" in text and "WERK_API_KEY" in text and "never from the command line" in text


# -- one error line with the fix -----------------------------------------------------------
def test_nothing_listening_is_one_line_naming_werk_serve(no_key: None, capsys: pytest.CaptureFixture[str]) -> None:
    port = closed_port()
    rc, out, err = werk(capsys, "runtime", "info", "--server", f"127.0.0.1:{port}")
    assert (rc, out) == (3, "")
    assert err == (
        f"werk: cannot reach werk serve at http://127.0.0.1:{port} "
        "(start it with `werk serve`, or pass --server URL or set WERK_SERVER)\n"
    )
    rc, _, err = werk(capsys, "deployments", "--server", f"http://127.0.0.1:{port}")
    assert rc == 3 and err.startswith(f"werk: cannot reach werk serve at http://127.0.0.1:{port} (start it")
    assert err.count("\n") == 1


def test_the_default_server_is_named_when_none_is_given(
    no_key: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    port = closed_port()
    monkeypatch.setattr("werk_host.cli.connection.DEFAULT_SERVER", f"http://127.0.0.1:{port}")
    rc, _, err = werk(capsys, "runtime", "memory")
    assert rc == 3 and err.startswith(f"werk: cannot reach werk serve at http://127.0.0.1:{port} (")


def test_a_keyed_server_without_a_key(live: Live, no_key: None, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = werk(capsys, "runtime", "info", "--server", live.url)
    assert (rc, out) == (22, "")
    assert err == f"werk: the server at {live.url} requires an API key (set WERK_API_KEY)\n"


def test_a_keyed_server_with_a_wrong_key(
    live: Live, no_key: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WERK_API_KEY", "sk-not-this-one")
    rc, _, err = werk(capsys, "runtime", "info", "--server", live.url)
    assert rc == 22
    assert err == (
        f"werk: the server at {live.url} did not accept the API key in WERK_API_KEY "
        "(set WERK_API_KEY to one of its keys)\n"
    )
    assert "sk-not-this-one" not in err


def test_json_errors_stay_json(live: Live, no_key: None, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = werk(capsys, "runtime", "info", "--server", live.url, "--json")
    assert rc == 22 and err.startswith('{\n  "error": {') and '"code": "unauthorized"' in err


def test_a_server_error_gives_its_message_and_code(env: Live, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = werk(capsys, "runtime", "experts", "list")
    assert rc == 28
    [line] = err.splitlines()
    assert line.startswith("werk: ") and "(experimental_opt_in_required, HTTP 428, request req_" in line
    assert line.endswith("; pass --allow-experimental to opt in)")
    rc, _, err = werk(capsys, "runtime", "states", "action", "st_missing", "pin")
    [line] = err.splitlines()
    assert rc == 24 and "(not_found, HTTP 404, request req_" in line


def test_forbidden_names_operator_keys(no_key: None, capsys: pytest.CaptureFixture[str]) -> None:
    body = error_envelope("forbidden", "unloading a shared model needs an operator key")
    with raw_server(http(body, status="403 Forbidden")) as srv:
        rc, _, err = werk(capsys, "runtime", "deployments", "--server", srv.url)
    assert rc == 23
    assert err == (
        "werk: unloading a shared model needs an operator key (set WERK_API_KEY to an operator key: one given "
        "to werk serve with --operator-api-key-file or WERK_OPERATOR_API_KEYS)\n"
    )


def test_a_timeout_names_the_timeout_option(no_key: None, capsys: pytest.CaptureFixture[str]) -> None:
    def silent(sock: socket.socket, stop: threading.Event) -> None:
        stop.wait(10)

    with raw_server(silent) as srv:
        rc, _, err = werk(capsys, "runtime", "info", "--server", srv.url, "--timeout", "0.5")
    assert rc == 4
    assert err == (
        f"werk: no answer from werk serve at {srv.url} within 0.5 s "
        "(pass a larger --timeout SECONDS, or check that it is up)\n"
    )


@pytest.mark.parametrize(
    ("server", "reason"),
    [
        ("https://127.0.0.1:1", "only http:// is accepted: Werk does not terminate TLS"),
        ("http://127.0.0.1", "an explicit port is required"),
        ("127.0.0.1:99999", "the port must be 1..65535"),
    ],
)
def test_a_bad_server_url_is_one_line(
    server: str, reason: str, no_key: None, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, err = werk(capsys, "runtime", "info", "--server", server)
    assert rc == 12
    assert err == f"werk: invalid server URL: {reason} (pass --server http://HOST:PORT or set WERK_SERVER to one)\n"


def test_local_input_errors_are_one_line(env: Live, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = werk(capsys, "runtime", "decode", "--handoff-file", str(tmp_path / "absent"))
    assert rc == 15 and err.startswith(f"werk: cannot open {tmp_path / 'absent'}: ") and err.count("\n") == 1
    rc, _, err = werk(capsys, "runtime", "states", "prune")
    assert rc == 14 and err == "werk: choose --id, --all, or at least one of --model-id, --tier, --older-than-unix-ms\n"


def test_a_server_that_is_not_werk_serve_is_one_line(no_key: None, capsys: pytest.CaptureFixture[str]) -> None:
    redirect = http(b"", status="302 Found", extra_headers=(("Location", "http://127.0.0.1:1/"),))
    with raw_server(redirect, http(b'{"not": "an envelope"}')) as srv:
        rc, _, err = werk(capsys, "runtime", "info", "--server", srv.url)
        assert (rc, err) == (
            8,
            f"werk: the server at {srv.url} answered with a redirect "
            "(pass the werk serve URL itself as --server or WERK_SERVER)\n",
        )
        rc, _, err = werk(capsys, "runtime", "info", "--server", srv.url)
    assert rc == 5 and err.startswith(f"werk: the server at {srv.url} did not answer as werk serve: ")
    assert err.endswith(" (check that --server or WERK_SERVER points at werk serve)\n") and err.count("\n") == 1


def test_a_bad_key_or_an_oversized_request_is_one_line(
    env: Live, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, err = werk(capsys, "runtime", "count-tokens", "--text", "x" * (1 << 20))
    assert (
        rc == 11
        and err.startswith("werk: the encoded request (")
        and err.endswith("(send less: a request is at most 1 MiB)\n")
    )
    monkeypatch.setenv("WERK_API_KEY", "has space")
    rc, _, err = werk(capsys, "runtime", "info")
    assert rc == 13 and err == (
        "werk: the API key must be 1..4096 printable ASCII characters without spaces (fix WERK_API_KEY)\n"
    )
