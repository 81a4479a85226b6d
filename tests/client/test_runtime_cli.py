"""``werk runtime …`` end to end: handoff files, previews, exit codes and secret hygiene."""

from __future__ import annotations

import io
import json
import logging
import os
import socket
import stat
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.client.conftest import LIVE_KEY, Live
from tests.client.rawserver import INFO, envelope, error_envelope, http, raw_server
from werk_host.cli import main
from werk_host.cli import runtime as runtime_cli
from werk_host.client import API_ERRORS


@dataclass
class Run:
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def error(self) -> dict[str, Any]:
        body: dict[str, Any] = json.loads(self.err)["error"]
        return body


def run(capsys: pytest.CaptureFixture[str], *argv: str, json_output: bool = True) -> Run:
    """``werk runtime ARGV`` (with ``--json`` unless ``json_output`` is false)."""
    rc = main(["runtime", *argv, *(["--json"] if json_output else [])])
    captured = capsys.readouterr()
    return Run(rc, captured.out, captured.err)


@pytest.fixture
def env(live: Live, monkeypatch: pytest.MonkeyPatch) -> Live:
    monkeypatch.setenv("WERK_SERVER", live.url)
    monkeypatch.setenv("WERK_API_KEY", LIVE_KEY)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    return live


def read_secret(path: Path) -> str:
    return path.read_text().rstrip("\n")


def prefill_args(handoff: Path, *extra: str) -> list[str]:
    return [
        "prefill",
        "--model",
        "tiny",
        "--text",
        "one two three four five",
        "--mode",
        "disk",
        "--allow-experimental",
        "--handoff-file",
        str(handoff),
        *extra,
    ]


# -- prefill -> decode ----------------------------------------------------------------------
def test_prefill_decode_round_trip_through_the_handoff_file(
    env: Live, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    handoff_file = tmp_path / "handoff"
    first = run(capsys, *prefill_args(handoff_file))
    assert first.rc == 0, first.err
    assert stat.S_IMODE(handoff_file.lstat().st_mode) == 0o600
    secret = read_secret(handoff_file)
    assert secret and secret not in first.out and secret not in first.err
    result = first.json()
    assert result["handoff"].startswith("[secret handoff written to ") and str(handoff_file) in result["handoff"]
    assert result["state_id"].startswith("st_") and result["tier"] == "disk" and result["prompt_tokens"] == 5

    second = run(
        capsys,
        "decode",
        "--handoff-file",
        str(handoff_file),
        "--max-tokens",
        "3",
        "--temperature",
        "0.2",
        "--top-p",
        "0.9",
        "--seed",
        "7",
        "--stop",
        "</a>",
        "--stop",
        "</b>",
        "--allow-experimental",
    )
    assert second.rc == 0, second.err
    assert second.json() == {
        "text": "one two three",
        "handoff": None,
        "completion_tokens": 3,
        "finish_reason": "length",
    }

    again = run(capsys, "decode", "--handoff-file", str(handoff_file), "--allow-experimental")
    assert again.rc == 27 and again.out == ""
    assert again.error()["code"] == "expired_handoff" and again.error()["request_id"].startswith("req_")


def test_prefill_with_messages_file_and_policy_flags(
    env: Live, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    messages = tmp_path / "messages.json"
    messages.write_text(
        json.dumps({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]})
    )
    out = run(
        capsys,
        "prefill",
        "--model",
        "tiny",
        "--messages-file",
        str(messages),
        "--mode",
        "disk",
        "--reuse",
        "disabled",
        "--ttl-seconds",
        "600",
        "--pin",
        "--allow-experimental",
        "--handoff-file",
        str(tmp_path / "h"),
    )
    assert out.rc == 0, out.err
    assert out.json()["expires_unix_ms"] is not None
    listed = run(capsys, "states", "list").json()["states"]
    assert len(listed) == 1 and listed[0]["pinned"] is True


def test_prefill_refuses_an_existing_file_or_a_link(
    env: Live, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    existing = tmp_path / "existing"
    existing.write_text("keep me")
    res = run(capsys, *prefill_args(existing))
    assert res.rc == 15 and existing.read_text() == "keep me"
    assert res.error()["code"] == "handoff_file"

    target = tmp_path / "target"
    link = tmp_path / "link"
    link.symlink_to(target)
    assert run(capsys, *prefill_args(link)).rc == 15
    assert not target.exists()
    assert run(capsys, *prefill_args(tmp_path / "missing-dir" / "h")).rc == 15
    assert run(capsys, "states", "list").json()["states"] == []  # nothing reached the server


def test_a_failed_prefill_leaves_no_handoff_file(env: Live, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    handoff_file = tmp_path / "h"
    res = run(
        capsys,
        "prefill",
        "--model",
        "tiny",
        "--text",
        "x",
        "--no-allow-experimental",
        "--handoff-file",
        str(handoff_file),
    )
    assert res.rc == 28 and res.error()["code"] == "experimental_opt_in_required"
    assert not handoff_file.exists()


def test_decode_refuses_unsafe_handoff_files(env: Live, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    handoff_file = tmp_path / "h"
    assert run(capsys, *prefill_args(handoff_file)).rc == 0
    secret = read_secret(handoff_file)

    handoff_file.chmod(0o644)
    res = run(capsys, "decode", "--handoff-file", str(handoff_file), "--allow-experimental")
    assert res.rc == 15 and "owner-only" in res.error()["message"]
    handoff_file.chmod(0o600)

    link = tmp_path / "link"
    link.symlink_to(handoff_file)
    assert run(capsys, "decode", "--handoff-file", str(link), "--allow-experimental").rc == 15
    assert run(capsys, "decode", "--handoff-file", str(tmp_path), "--allow-experimental").rc == 15
    assert run(capsys, "decode", "--handoff-file", str(tmp_path / "absent"), "--allow-experimental").rc == 15
    empty = tmp_path / "empty"
    empty.touch(mode=0o600)
    assert run(capsys, "decode", "--handoff-file", str(empty), "--allow-experimental").rc == 15
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    assert run(capsys, "decode", "--handoff-file", str(fifo), "--allow-experimental").rc == 15

    # none of the refusals consumed the handoff
    ok = run(capsys, "decode", "--handoff-file", str(handoff_file), "--allow-experimental")
    assert ok.rc == 0, ok.err
    assert secret not in ok.out


def test_decode_stores_a_next_handoff(
    live_continuing: Live, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WERK_SERVER", live_continuing.url)
    monkeypatch.setenv("WERK_API_KEY", LIVE_KEY)
    tmp_path = tmp_path / "secrets"
    tmp_path.mkdir(mode=0o700)
    handoff_file = tmp_path / "h"
    assert run(capsys, *prefill_args(handoff_file)).rc == 0
    first_secret = read_secret(handoff_file)

    replaced = run(capsys, "decode", "--handoff-file", str(handoff_file), "--max-tokens", "1", "--allow-experimental")
    assert replaced.rc == 0, replaced.err
    second_secret = read_secret(handoff_file)
    assert second_secret != first_secret
    assert stat.S_IMODE(handoff_file.lstat().st_mode) == 0o600
    assert str(handoff_file) in replaced.json()["handoff"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h"]  # no temporary file left behind

    # the in-memory backend's next state has no live handle, so start a fresh prefill for this leg
    fresh = tmp_path / "fresh"
    assert run(capsys, *prefill_args(fresh)).rc == 0
    third_secret = read_secret(fresh)
    next_file = tmp_path / "next"
    moved = run(
        capsys,
        "decode",
        "--handoff-file",
        str(fresh),
        "--next-handoff-file",
        str(next_file),
        "--max-tokens",
        "1",
        "--allow-experimental",
    )
    assert moved.rc == 0, moved.err
    assert stat.S_IMODE(next_file.lstat().st_mode) == 0o600
    fourth_secret = read_secret(next_file)
    assert fourth_secret not in (first_secret, second_secret, third_secret)
    assert read_secret(fresh) == third_secret  # the consumed handoff file is left as it was
    assert str(next_file) in moved.json()["handoff"]
    for text in (replaced.out, replaced.err, moved.out, moved.err):
        assert all(s not in text for s in (first_secret, second_secret, third_secret, fourth_secret))


# -- previews --------------------------------------------------------------------------------
def test_state_mutations_are_previews_unless_execute(
    env: Live, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state_id = run(capsys, *prefill_args(tmp_path / "h")).json()["state_id"]

    preview = run(capsys, "states", "action", state_id, "pin")
    assert preview.rc == 0 and preview.json()["dry_run"] is True and preview.json()["state"]["pinned"] is True
    assert run(capsys, "states", "list").json()["states"][0]["pinned"] is False
    done = run(capsys, "states", "action", state_id, "pin", "--allow-experimental", "--execute")
    assert done.rc == 0 and done.json()["dry_run"] is False
    assert run(capsys, "states", "list").json()["states"][0]["pinned"] is True
    assert run(capsys, "states", "action", state_id, "unpin", "--allow-experimental", "--execute").rc == 0

    preview = run(capsys, "states", "prune", "--all")
    assert preview.json() == {**preview.json(), "matched": 1, "removed": 0, "dry_run": True}
    assert len(run(capsys, "states", "list").json()["states"]) == 1
    done = run(capsys, "states", "prune", "--id", state_id, "--execute")
    assert done.json() == {**done.json(), "matched": 1, "removed": 1, "dry_run": False}
    assert run(capsys, "states", "list").json()["states"] == []


STATE_RESULT = {
    "state": {
        "id": "st_a",
        "model_id": "m",
        "backend": "b",
        "tier": "disk",
        "status": "ready",
        "bytes": None,
        "created_unix_ms": 1,
        "last_accessed_unix_ms": 1,
        "expires_unix_ms": None,
        "pinned": True,
        "reusable": True,
    },
    "changed": True,
    "dry_run": True,
}
MUTATIONS = {
    "states-action": (["states", "action", "st_a", "pin"], STATE_RESULT),
    "states-prune": (
        ["states", "prune", "--model-id", "m", "--older-than-unix-ms", "5"],
        {"matched": 0, "removed": 0, "bytes": None, "dry_run": True},
    ),
    "experts-action": (
        ["experts", "action", "evict", "--model-id", "m", "--expert-id", "e1", "--expert-id", "e2"],
        {"experts": [], "changed": False, "dry_run": True},
    ),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
@pytest.mark.parametrize("execute", [False, True])
def test_mutation_requests_carry_dry_run_unless_execute(
    name: str, execute: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv, data = MUTATIONS[name]
    monkeypatch.delenv("WERK_API_KEY", raising=False)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    with raw_server(http(envelope(data))) as srv:
        res = run(capsys, *argv, "--server", srv.url, *(["--execute"] if execute else []))
    assert res.rc == 0, res.err
    assert srv.requests[0].json()["dry_run"] is (not execute)


# -- every route, exit codes ------------------------------------------------------------------
COMMANDS: dict[str, tuple[list[str], str, str]] = {
    "info": (["info"], "GET", "/werk/v1/info"),
    "capabilities": (["capabilities"], "GET", "/werk/v1/capabilities"),
    "memory": (["memory"], "GET", "/werk/v1/memory"),
    "observability": (["observability"], "GET", "/werk/v1/observability"),
    "deployments": (["deployments"], "GET", "/werk/v1/deployments"),
    "states-list": (
        ["states", "list", "--model-id", "m", "--tier", "ram", "--limit", "7", "--cursor", "c"],
        "GET",
        "/werk/v1/states?model_id=m&tier=ram&limit=7&cursor=c",
    ),
    "states-action": (
        ["states", "action", "st_x", "demote", "--target-tier", "disk"],
        "POST",
        "/werk/v1/states/st_x/actions",
    ),
    "states-prune": (["states", "prune", "--id", "st_x", "--id", "st_y"], "POST", "/werk/v1/states/prune"),
    "experts-list": (
        ["experts", "list", "--allow-experimental"],
        "GET",
        "/werk/v1/experts?limit=100&allow_experimental=true",
    ),
    "experts-action": (
        ["experts", "action", "prefetch", "--model-id", "m", "--expert-id", "e", "--target-tier", "ram"],
        "POST",
        "/werk/v1/experts/actions",
    ),
    "prefill": (["prefill", "--model", "m", "--text", "t", "--handoff-file", "{tmp}/new"], "POST", "/werk/v1/prefill"),
    "decode": (["decode", "--handoff-file", "{tmp}/h"], "POST", "/werk/v1/decode"),
    "count-tokens": (["count-tokens", "--text", "hi", "--model", "m"], "POST", "/werk/v1/chat/count_tokens"),
    "admission": (["admission", "--request-file", "{tmp}/req.json"], "POST", "/werk/v1/chat/admission"),
    "limits": (["limits", "--model", "m"], "GET", "/werk/v1/chat/limits?model=m"),
    "reasoning": (["reasoning", "--max-output-tokens", "64"], "GET", "/werk/v1/chat/reasoning?max_output_tokens=64"),
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_reaches_its_route(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv, method, target = COMMANDS[name]
    (tmp_path / "h").write_text("opaque")
    (tmp_path / "h").chmod(0o600)
    (tmp_path / "req.json").write_text(json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}))
    monkeypatch.setenv("WERK_API_KEY", "sk-route-check")
    raw = http(error_envelope("unsupported", "nope", request_id="req_z"), status="501 Not Implemented")
    with raw_server(raw) as srv:
        monkeypatch.setenv("WERK_SERVER", srv.url)
        res = run(capsys, *[a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert res.rc == 30 and res.out == ""
    assert res.error() == {
        "type": "UnsupportedError",
        "code": "unsupported",
        "message": "nope",
        "retryable": False,
        "request_id": "req_z",
        "status": 501,
    }
    [req] = srv.requests
    assert (req.method, req.target) == (method, target)
    assert req.headers["authorization"] == "Bearer sk-route-check"
    assert not (tmp_path / "new").exists()


#: Each command against the live reference backend, and what its JSON output must say.
LIVE_COMMANDS: dict[str, tuple[list[str], Callable[[Any], bool]]] = {
    "info": (["info"], lambda d: d["protocol"] == {"major": 1, "minor": 0} and d["active_backend"] == "test-backend"),
    "capabilities": (
        ["capabilities"],
        lambda d: {c["id"]: c["status"] for c in d}["runtime.experts.residency"] == "experimental",
    ),
    "memory": (["memory"], lambda d: d["counters"]["active_reservations"] == 0),
    "observability": (["observability"], lambda d: d["chat"]["requests_total"] == 0 and len(d["workers"]) == 1),
    "deployments": (["deployments"], lambda d: set(d) == {"inventory", "plans", "slots"}),
    "states-list": (["states", "list"], lambda d: d == {"states": [], "next_cursor": None}),
    "states-prune": (["states", "prune", "--tier", "disk"], lambda d: (d["matched"], d["dry_run"]) == (0, True)),
    "experts-list": (
        ["experts", "list", "--allow-experimental"],
        lambda d: len(d["experts"]) == 8 and {e["tier"] for e in d["experts"]} == {"ram", "external"},
    ),
    "experts-action": (
        ["experts", "action", "pin", "--model-id", "tiny", "--expert-id", "layer0.expert1", "--allow-experimental"],
        lambda d: d["dry_run"] is True and d["experts"][0]["id"] == "layer0.expert1" and d["experts"][0]["pinned"],
    ),
    "count-tokens": (["count-tokens", "--text", "hello world"], lambda d: d == {"model": "tiny", "input_tokens": 4}),
    "admission": (
        ["admission", "--text", "hello world", "--max-tokens", "9"],
        lambda d: (d["input_tokens"], d["max_output_tokens"], d["token_count_method"]) == (4, 9, "native"),
    ),
    "limits": (["limits"], lambda d: (d["model"], d["context_tokens"], d["max_output_tokens"]) == ("tiny", 64, 63)),
    "limits-model": (["limits", "--model", "tiny"], lambda d: d["model"] == "tiny"),
    "reasoning": (["reasoning", "--model", "tiny"], lambda d: d["supported"] is True and d["model"] == "tiny"),
}


@pytest.mark.parametrize("name", sorted(LIVE_COMMANDS))
def test_commands_against_a_real_server(name: str, env: Live, capsys: pytest.CaptureFixture[str]) -> None:
    argv, check = LIVE_COMMANDS[name]
    res = run(capsys, *argv)
    assert res.rc == 0 and res.err == "", res.err
    assert check(res.json()), res.out


def test_an_experimental_route_without_opt_in_exits_with_its_code(
    env: Live, capsys: pytest.CaptureFixture[str]
) -> None:
    res = run(capsys, "experts", "list")
    assert res.rc != 0 and res.out == ""
    assert res.error()["code"] == "experimental_opt_in_required" and res.error()["status"] == 428


def _refused_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    sock.close()
    return port


def _silent(sock: socket.socket, stop: threading.Event) -> None:
    stop.wait(10)


CLIENT_FAILURES: dict[str, tuple[Any, int]] = {
    "redirect": (http(b"", status="302 Found", extra_headers=(("Location", "http://127.0.0.1:1/"),)), 8),
    "framing": (http(envelope(INFO), content_length=5000), 6),
    "too-large": (http(b"", content_length=(8 << 20) + 1), 7),
    "version-header": (http(envelope(INFO), version_header="1.1"), 9),
    "newer-minor": (http(envelope(INFO, minor=1), version_header=None), 10),
    "other-major": (http(envelope(INFO, major=2), version_header="2.0"), 10),
    "missing-envelope": (http(json.dumps(INFO).encode()), 5),
    "timeout": (_silent, 4),
}


@pytest.mark.parametrize("name", sorted(CLIENT_FAILURES))
def test_client_failure_exit_codes(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    script, code = CLIENT_FAILURES[name]
    monkeypatch.setenv("WERK_API_KEY", "sk-exit-codes")
    with raw_server(script) as srv:
        res = run(capsys, "info", "--server", srv.url, "--timeout", "0.5")
    assert res.rc == code and res.out == ""
    assert res.error()["type"] == next(c.__name__ for c, v in runtime_cli.EXIT_CODES.items() if v == code)


def test_local_failure_exit_codes(
    env: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "info", "--server", f"http://127.0.0.1:{_refused_port()}").rc == 3
    bad_url = run(capsys, "info", "--server", "https://127.0.0.1:1")
    assert bad_url.rc == 12 and bad_url.error()["code"] == "invalid_base_url"
    monkeypatch.setenv("WERK_SERVER", "http://127.0.0.1/no-port")
    assert run(capsys, "info").rc == 12
    monkeypatch.setenv("WERK_SERVER", env.url)

    monkeypatch.setenv("WERK_API_KEY", "has space")
    assert run(capsys, "info").rc == 13
    monkeypatch.setenv("WERK_API_KEY", "sk-wrong")
    wrong = run(capsys, "info")
    assert wrong.rc == 22 and wrong.error()["code"] == "unauthorized" and wrong.error()["status"] == 401
    monkeypatch.setenv("WERK_API_KEY", LIVE_KEY)

    assert run(capsys, "states", "action", "../info", "pin").rc == 13
    assert run(capsys, "states", "action", "st_missing", "pin").rc == 24
    assert run(capsys, "states", "action", "st_x", "promote").rc == 14  # target tier missing
    assert run(capsys, "states", "prune").rc == 14
    assert run(capsys, "states", "prune", "--all", "--id", "st_x").rc == 14
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{nope")
    assert run(capsys, "count-tokens", "--messages-file", str(bad_json)).rc == 14
    assert run(capsys, "count-tokens", "--request-file", str(tmp_path / "absent.json")).rc == 14
    res = run(capsys, "count-tokens", "--text", "x" * (1 << 20))
    assert res.rc == 11 and res.error()["code"] == "request_too_large"
    secret_like = "sk-not-to-echo-1234"
    res = run(
        capsys,
        "prefill",
        "--model",
        "tiny",
        "--text",
        secret_like,
        "--ttl-seconds",
        "99999999",
        "--handoff-file",
        str(tmp_path / "h"),
    )
    assert res.rc == 14 and secret_like not in res.err and not (tmp_path / "h").exists()


def test_usage_errors_and_no_key_on_argv(env: Live, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["info", "--api-key", LIVE_KEY],
        ["prefill", "--model", "tiny", "--text", "x"],
        ["states"],
        ["decode"],
        ["states", "action", "st_x", "explode"],
    ):
        with pytest.raises(SystemExit) as caught:
            main(["runtime", *argv])
        assert caught.value.code == 2
    assert LIVE_KEY not in capsys.readouterr().err


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_key_prompt_appears_only_on_a_terminal(
    live: Live, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WERK_SERVER", live.url)
    monkeypatch.delenv("WERK_API_KEY", raising=False)
    prompts: list[str] = []

    def fake_getpass(prompt: str = "") -> str:
        prompts.append(prompt)
        return LIVE_KEY

    monkeypatch.setattr("getpass.getpass", fake_getpass)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert run(capsys, "info").rc == 22 and prompts == []
    monkeypatch.setattr(sys, "stdin", _Tty(""))
    assert run(capsys, "info").rc == 0 and len(prompts) == 1


def test_exit_code_table_is_distinct_and_documented() -> None:
    codes = list(runtime_cli.EXIT_CODES.values())
    assert len(codes) == len(set(codes))
    assert set(API_ERRORS.values()) <= set(runtime_cli.EXIT_CODES)
    doc = (Path(__file__).parents[2] / "docs" / "cli.md").read_text()
    for cls, code in runtime_cli.EXIT_CODES.items():
        assert f"| {code:<4} | {cls.__name__:<32} |" in doc, cls
    for code, what in ((0, "—"), (2, "(argparse)"), (130, "KeyboardInterrupt")):
        assert f"| {code:<4} | {what:<32} |" in doc


def test_no_key_or_handoff_in_any_output_or_log(
    env: Live, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    handoff_file = tmp_path / "h"
    transcript: list[Run] = [run(capsys, *prefill_args(handoff_file))]
    secret = read_secret(handoff_file)
    transcript += [
        run(capsys, "states", "list"),
        run(capsys, "decode", "--handoff-file", str(handoff_file), "--max-tokens", "2", "--allow-experimental"),
        run(capsys, "decode", "--handoff-file", str(handoff_file), "--allow-experimental"),  # expired
        run(capsys, "info", "--server", f"http://127.0.0.1:{_refused_port()}"),
    ]
    assert [r.rc for r in transcript] == [0, 0, 0, 27, 3]
    captured = "\n".join([caplog.text] + [r.out + r.err for r in transcript])
    assert "werk_host" in caplog.text  # the scan did see the host's and client's logs
    assert LIVE_KEY not in captured
    assert secret not in captured
