"""OpenAPI freshness, model manifests and `werk serve` as a real process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from werk_host.cli import main
from werk_host.openapi import build_openapi
from werk_host.testing.api import Api

ROOT = Path(__file__).resolve().parents[1]


def test_committed_openapi_is_current() -> None:
    committed = json.loads((ROOT / "docs" / "openapi.json").read_text())
    assert committed == build_openapi(), "regenerate: python -m werk_host.openapi > docs/openapi.json"


def test_openapi_covers_every_route_and_schema() -> None:
    from werk_host.http.resources import ROUTES

    doc = build_openapi()
    assert {path for path, _ in ROUTES} <= set(doc["paths"])
    prefill = doc["components"]["schemas"]["PrefillRequest"]
    assert prefill["additionalProperties"] is False
    ttl = doc["components"]["schemas"]["Policy"]["properties"]["ttl_seconds"]
    assert {"minimum": 1, "maximum": 2592000}.items() <= next(
        s for s in ttl["anyOf"] if s.get("type") == "integer"
    ).items()


def test_response_schemas_are_readable() -> None:
    """A handoff is returned by prefill and decode: no response schema may mark it (or anything)
    ``writeOnly``, while the decode request's handoff stays write-only."""
    doc = build_openapi()
    schemas = doc["components"]["schemas"]
    for name in ("PrefillResult", "DecodeResult"):
        assert "writeOnly" not in json.dumps(schemas[name]), name
    for path in ("/werk/v1/prefill", "/werk/v1/decode"):
        assert "writeOnly" not in json.dumps(doc["paths"][path]["post"]["responses"]), path
    assert schemas["DecodeRequest"]["properties"]["handoff"]["writeOnly"] is True


def test_tool_shapes_are_documented() -> None:
    schemas = build_openapi()["components"]["schemas"]
    tools = schemas["ChatRequest"]["properties"]["tools"]["anyOf"][0]
    assert tools == {"type": "array", "items": {"$ref": "#/components/schemas/FunctionTool"}}
    assert schemas["FunctionTool"]["properties"]["type"] == {"const": "function", "title": "Type", "type": "string"}
    assert schemas["FunctionDefinition"]["required"] == ["name"]
    assert {"id", "type", "function"} <= set(schemas["ToolCall"]["required"])


def test_models_add_list_rm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    weights = tmp_path / "m.gguf"
    weights.write_bytes(b"GGUF" + b"\0" * 60)
    assert (
        main(
            [
                "models",
                "add",
                "demo",
                str(weights),
                "--backend",
                "llama.cpp",
                "--param",
                "max_output_tokens=512",
                "--home",
                str(home),
                "--json",
            ]
        )
        == 0
    )
    added = json.loads(capsys.readouterr().out)
    assert added["files"][0]["bytes"] == 64
    assert added["params"] == {"max_output_tokens": 512}
    assert len(added["files"][0]["sha256"]) == 64
    assert main(["models", "list", "--home", str(home), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in listed] == ["demo"] and listed[0]["identity"] == added["identity"]
    weights.write_bytes(b"GGUF" + b"\1" * 60)  # same name, new content: a new identity
    assert main(["models", "add", "demo", str(weights), "--home", str(home), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["identity"] != added["identity"]
    assert main(["models", "rm", "demo", "--home", str(home)]) == 0
    assert main(["models", "rm", "demo", "--home", str(home)]) == 1
    assert (home / "models").stat().st_mode & 0o777 == 0o700
    model_dir = tmp_path / "hf-model"
    model_dir.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (model_dir / name).write_text(name)
    (model_dir / ".cache").mkdir()
    capsys.readouterr()
    assert main(["models", "add", "hf", str(model_dir), "--backend", "vllm", "--home", str(home), "--json"]) == 0
    files = [Path(f["path"]).name for f in json.loads(capsys.readouterr().out)["files"]]
    assert files == ["config.json", "model.safetensors", "tokenizer.json"]  # every file of the directory


def test_werk_serve_process_answers_and_stops_on_sigterm(tmp_path: Path) -> None:
    key = "sk-werk-serve-test-key-42"
    env = {**os.environ, "WERK_HOME": str(tmp_path / "home"), "WERK_API_KEYS": key}
    proc = subprocess.Popen(
        [sys.executable, "-m", "werk_host.cli", "serve", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None
        listening = json.loads(proc.stdout.readline())
        api = Api(f"http://127.0.0.1:{listening['port']}", key)
        status, body = api.get("/werk/v1/info")
        assert status == 200 and body["data"]["active_backend"] is None
        assert Api(f"http://127.0.0.1:{listening['port']}").get("/werk/v1/info")[0] == 401
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    logs = proc.stderr.read() if proc.stderr else ""
    assert key not in logs
    # the log is JSON lines; the one human block is the start summary (docs/cli.md, "werk serve")
    human = [line for line in logs.splitlines() if line.strip() and not line.startswith("{")]
    assert human[0] == f"werk serve: ready on http://127.0.0.1:{listening['port']}" and human[-1].startswith("  Ollama")
    assert all(json.loads(line)["level"] for line in logs.splitlines() if line.startswith("{"))
    secret = tmp_path / "home" / "auth" / "runtime-namespace.key"
    assert secret.stat().st_mode & 0o777 == 0o600 and secret.stat().st_size == 32


def test_unauthenticated_serve_warns_loudly(tmp_path: Path) -> None:
    env = {**os.environ, "WERK_HOME": str(tmp_path / "home")}
    env.pop("WERK_API_KEYS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "werk_host.cli", "serve", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None
        json.loads(proc.stdout.readline())
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "NO API KEYS CONFIGURED" in (proc.stderr.read() if proc.stderr else "")
