"""The n8n nodes of Werk host in the real n8n against a real ``werk serve`` (docs/n8n.md).

n8n (pinned, cached by ``scripts/setup-n8n.sh``) loads the built package ``n8n-nodes-werk`` from
a directory named in ``N8N_CUSTOM_EXTENSIONS`` (node types ``CUSTOM.*``); a credential and three
workflows are imported with ``n8n import:credentials`` / ``n8n import:workflow`` and each
workflow runs headless with ``n8n execute --id``. ``werk serve`` runs llama.cpp on the real
SmolLM2-135M-Instruct, greedy, with an API key.

* Manual Trigger -> Werk Chat ("Say hello"): the answer text is non-empty.
* Manual Trigger -> Werk Prefill -> Werk Decode: the decode text is non-empty, the handoff is
  in no JSON of the printed run or the saved execution (only in the binary field
  ``werkHandoff``), and it was consumed (a second decode of it is 410 ``expired_handoff``).
* Manual Trigger -> Werk Experts without the opt-in: the run fails with the node's refusal and
  no request reaches ``/werk/v1/experts`` (the server's ``/metrics`` count stays the same).

Skips only when npm is missing or n8n cannot be installed here (the reason is shown).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import sqlite3
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from werk_llamacpp.process import ENV_ARGS

from werk_host.plugin import ModelManifest
from werk_host.testing.host import ModelRegistry
from werk_host.testing.hosts import serve_process

pytestmark = pytest.mark.llamaserver
ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "integrations" / "n8n"
KEY = "sk-werk-n8n-e2e-7731"
MODEL = "smollm2"
#: The handoff format (werk_host/service/handoffs.py: "wh_" + secrets.token_urlsafe(32)).
HANDOFF_RE = re.compile(r"wh_[A-Za-z0-9_-]{20,}")
REFUSAL = "Werk Experts refused to run: expert controls are experimental"
INSTALL_TIMEOUT_S = 1800
BUILD_TIMEOUT_S = 600
N8N_TIMEOUT_S = 300
CREDENTIAL_ID = "werkE2eCredential1"


@dataclass
class Served:
    url: str
    log: Path


@dataclass
class N8n:
    binary: Path
    env: dict[str, str]
    folder: Path

    def run(self, *args: str, timeout: float = N8N_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.binary), *args],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.folder,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )


@pytest.fixture(scope="module")
def n8n_binary() -> Path:
    if shutil.which("npm") is None:
        pytest.skip("npm not found: the n8n end-to-end test installs n8n with npm")
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup-n8n.sh")], capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S
    )
    if done.returncode == 3:
        pytest.skip(f"scripts/setup-n8n.sh: {done.stderr.strip()[-500:]}")
    if done.returncode != 0:
        reason = f"scripts/setup-n8n.sh exit {done.returncode}"
        pytest.skip(f"n8n cannot be installed here ({reason}): {done.stderr[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def package() -> Path:
    """The built package (``npm ci && npm run build`` when ``dist/`` is missing)."""
    if not (PACKAGE / "dist" / "nodes").is_dir():
        if shutil.which("npm") is None:
            pytest.skip("npm not found: cannot build integrations/n8n")
        for cmd in (["npm", "ci", "--no-audit", "--no-fund"], ["npm", "run", "build"]):
            done = subprocess.run(cmd, cwd=PACKAGE, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
            assert done.returncode == 0, f"{' '.join(cmd)}: {done.stdout[-2000:]} {done.stderr[-2000:]}"
    return PACKAGE


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, llama_server_path: Path, smollm2_gguf: Path) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("werk")
    home = root / "home"
    home.mkdir()
    ModelRegistry(home).add(ModelManifest.from_paths(MODEL, [smollm2_gguf], backend="llama.cpp"))
    environ = {"WERK_LLAMA_SERVER": str(llama_server_path), ENV_ARGS: "--temp 0"}
    with serve_process(home, "--model", MODEL, keys=(KEY,), env=environ) as proc:
        yield Served(proc.url, proc.log)


def _install_package(package: Path, n8n_binary: Path, extensions: Path) -> None:
    """The package in a directory of ``N8N_CUSTOM_EXTENSIONS`` (n8n's CustomDirectoryLoader: its
    node types are ``CUSTOM.<name>``). ``n8n-workflow`` (the package's peer dependency) resolves
    to n8n's own copy, so the nodes' errors are n8n's classes."""
    target = extensions / "n8n-nodes-werk"
    target.mkdir(parents=True)
    shutil.copy2(package / "package.json", target / "package.json")
    shutil.copytree(package / "dist", target / "dist")
    n8n_modules = n8n_binary.resolve().parents[2]  # .../node_modules/n8n/bin/n8n -> .../node_modules
    (extensions / "node_modules").mkdir()
    (extensions / "node_modules" / "n8n-workflow").symlink_to(n8n_modules / "n8n-workflow", target_is_directory=True)


@pytest.fixture(scope="module")
def n8n(n8n_binary: Path, package: Path, served: Served, tmp_path_factory: pytest.TempPathFactory) -> N8n:
    folder = tmp_path_factory.mktemp("n8n")
    extensions = folder / "extensions"
    _install_package(package, n8n_binary, extensions)
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR", "SSL_CERT_FILE")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(
        HOME=str(folder),
        N8N_USER_FOLDER=str(folder),
        N8N_CUSTOM_EXTENSIONS=str(extensions),
        N8N_ENCRYPTION_KEY="werk-n8n-e2e-encryption-key",
        N8N_DIAGNOSTICS_ENABLED="false",
        N8N_VERSION_NOTIFICATIONS_ENABLED="false",
        N8N_TEMPLATES_ENABLED="false",
        N8N_PERSONALIZATION_ENABLED="false",
        N8N_ENFORCE_SETTINGS_FILE_PERMISSIONS="false",
        N8N_RUNNERS_ENABLED="false",
        # The "vm" engine needs isolated-vm, which does not build on Node 20 (scripts/setup-n8n.sh).
        N8N_EXPRESSION_ENGINE="legacy",
        N8N_DEFAULT_BINARY_DATA_MODE="default",
        EXECUTIONS_DATA_SAVE_ON_SUCCESS="all",
        EXECUTIONS_DATA_SAVE_ON_ERROR="all",
        DB_SQLITE_POOL_SIZE="2",
        # `n8n execute` prints the run through its logger at level info.
        N8N_LOG_LEVEL="info",
        N8N_LOG_OUTPUT="console",
        NO_COLOR="1",
    )
    app = N8n(n8n_binary, env, folder)
    credentials = folder / "credentials.json"
    data = {"baseUrl": served.url, "apiKey": KEY}
    credentials.write_text(json.dumps([{"id": CREDENTIAL_ID, "name": "Werk (e2e)", "type": "werkApi", "data": data}]))
    done = app.run("import:credentials", f"--input={credentials}")
    assert done.returncode == 0, f"import:credentials: {done.stdout[-3000:]} {done.stderr[-3000:]}"
    workflows = folder / "workflows.json"
    workflows.write_text(json.dumps([chat_workflow(), prefill_decode_workflow(), experts_workflow()]))
    done = app.run("import:workflow", f"--input={workflows}")
    assert done.returncode == 0, f"import:workflow: {done.stdout[-3000:]} {done.stderr[-3000:]}"
    return app


CREDENTIALS = {"werkApi": {"id": CREDENTIAL_ID, "name": "Werk (e2e)"}}


def _trigger() -> dict[str, Any]:
    return {
        "id": "trigger",
        "name": "When clicking 'Execute workflow'",
        "type": "n8n-nodes-base.manualTrigger",
        "typeVersion": 1,
        "position": [0, 0],
        "parameters": {},
    }


def _workflow(wid: str, name: str, nodes: list[dict[str, Any]]) -> dict[str, Any]:
    chain = [_trigger(), *nodes]
    pairs = zip(chain, chain[1:], strict=False)
    connections = {a["name"]: {"main": [[{"node": b["name"], "type": "main", "index": 0}]]} for a, b in pairs}
    return {
        "id": wid,
        "name": name,
        "active": False,
        "nodes": chain,
        "connections": connections,
        "settings": {"executionOrder": "v1"},
    }


def chat_workflow() -> dict[str, Any]:
    """Manual Trigger -> Werk Chat (the worked example of docs/n8n.md)."""
    chat = {
        "id": "chat",
        "name": "Werk Chat",
        "type": "CUSTOM.werkChat",
        "typeVersion": 1,
        "position": [240, 0],
        "parameters": {
            "model": MODEL,
            "prompt": "Say hello",
            "options": {"maxTokens": 32, "temperature": 0, "seed": 1},
        },
        "credentials": CREDENTIALS,
    }
    return _workflow("werkE2eChat00001", "Werk chat", [chat])


def prefill_decode_workflow() -> dict[str, Any]:
    prefill = {
        "id": "prefill",
        "name": "Werk Prefill",
        "type": "CUSTOM.werkPrefillDecode",
        "typeVersion": 1,
        "position": [240, 0],
        "parameters": {
            "operation": "prefill",
            "modelId": MODEL,
            "text": "The capital of France is",
            "allowExperimental": True,
        },
        "credentials": CREDENTIALS,
    }
    decode = {
        "id": "decode",
        "name": "Werk Decode",
        "type": "CUSTOM.werkPrefillDecode",
        "typeVersion": 1,
        "position": [480, 0],
        "parameters": {"operation": "decode", "maxTokens": 16, "options": {"allowExperimental": True}},
        "credentials": CREDENTIALS,
    }
    return _workflow("werkE2ePrefill001", "Werk prefill and decode", [prefill, decode])


def experts_workflow() -> dict[str, Any]:
    experts = {
        "id": "experts",
        "name": "Werk Experts",
        "type": "CUSTOM.werkExperts",
        "typeVersion": 1,
        "position": [240, 0],
        "parameters": {"operation": "list", "modelId": MODEL},
        "credentials": CREDENTIALS,
    }
    return _workflow("werkE2eExperts01", "Werk experts without opt-in", [experts])


def _execute(n8n: N8n, wid: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    """``n8n execute --id --rawOutput``: the process and the run data it printed (or None)."""
    done = n8n.run("execute", f"--id={wid}", "--rawOutput")
    data = None
    lines = done.stdout.splitlines()
    for at, line in enumerate(lines):  # the run is the JSON document from a line "{" on
        if line == "{":
            try:
                data = json.loads("\n".join(lines[at:]))
                break
            except json.JSONDecodeError:
                continue
    return done, data


def _node_items(data: Any, node: str) -> list[dict[str, Any]]:
    run = data["data"]["resultData"]["runData"] if "data" in data else data["resultData"]["runData"]
    return run[node][0]["data"]["main"][0]


def _binaries(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict):
        if isinstance(value.get("binary"), dict):
            yield from (b for b in value["binary"].values() if isinstance(b, dict))
        for child in value.values():
            yield from _binaries(child)
    elif isinstance(value, list):
        for child in value:
            yield from _binaries(child)


def _saved_executions(n8n: N8n) -> str:
    """Everything n8n saved of its executions (the sqlite database's execution_data)."""
    db = n8n.folder / ".n8n" / "database.sqlite"
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT data FROM execution_data").fetchall()
    return "\n".join(str(r[0]) for r in rows)


def _decode_status(served: Served, handoff: str) -> tuple[int, dict[str, Any]]:
    body = json.dumps({"handoff": handoff, "max_tokens": 1, "allow_experimental": True}).encode()
    req = urllib.request.Request(
        f"{served.url}/werk/v1/decode",
        data=body,
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _expert_requests(served: Served) -> float:
    """Requests the server counted on its expert routes (``GET /metrics``, by route template)."""
    req = urllib.request.Request(f"{served.url}/metrics", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        text = resp.read().decode()
    assert "werk_http_requests_total" in text or "_requests_total" in text, text[:500]
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if "_requests_total{" in line and 'route="/werk/v1/experts' in line
    )


def _server_errors(served: Served) -> list[str]:
    text = served.log.read_text(errors="replace")
    return [line for line in text.splitlines() if "Traceback" in line or '"level": "error"' in line]


def test_chat_workflow_answers(n8n: N8n, served: Served) -> None:
    done, data = _execute(n8n, "werkE2eChat00001")
    assert done.returncode == 0, f"n8n execute: {done.stdout[-3000:]} {done.stderr[-3000:]}"
    assert data is not None, done.stdout[-3000:]
    [item] = _node_items(data, "Werk Chat")
    answer = item["json"]
    assert isinstance(answer["text"], str) and answer["text"].strip(), answer
    assert answer["finish_reason"] in ("stop", "length")
    assert answer["usage"]["completion_tokens"] > 0
    assert not _server_errors(served)


def test_prefill_decode_keeps_the_handoff_out_of_json(n8n: N8n, served: Served) -> None:
    done, data = _execute(n8n, "werkE2ePrefill001")
    printed = done.stdout + done.stderr
    assert done.returncode == 0, f"n8n execute: {printed[-4000:]}"
    assert data is not None, done.stdout[-3000:]
    [prefilled] = _node_items(data, "Werk Prefill")
    assert prefilled["json"]["handoff"] == "[in binary werkHandoff]"
    assert prefilled["json"]["prompt_tokens"] > 0
    assert prefilled["binary"]["werkHandoff"]["mimeType"] == "application/vnd.werk.handoff"
    [decoded] = _node_items(data, "Werk Decode")
    assert isinstance(decoded["json"]["text"], str) and decoded["json"]["text"].strip(), decoded
    assert decoded["json"]["handoff"] is None
    assert "werkHandoff" not in (decoded.get("binary") or {})

    # The handoff itself, from the binary field it travels in (base64, n8n's default mode).
    handoffs = [
        base64.b64decode(b["data"]).decode()
        for b in _binaries(data)
        if b.get("mimeType") == "application/vnd.werk.handoff"
    ]
    assert handoffs and all(HANDOFF_RE.fullmatch(h) for h in handoffs), "the binary holds the handoff"
    saved = _saved_executions(n8n)
    for text, where in ((printed, "n8n's printed output"), (saved, "the saved execution")):
        assert not HANDOFF_RE.search(text), f"a handoff in {where}"
        for handoff in handoffs:
            assert handoff not in text, f"the handoff in {where}"
    assert not HANDOFF_RE.search(served.log.read_text(errors="replace")), "a handoff in the server log"
    # Single use: the node's decode consumed it.
    status, body = _decode_status(served, handoffs[0])
    assert (status, body["error"]["code"]) == (410, "expired_handoff")
    assert not _server_errors(served)


def test_experts_without_opt_in_refuses(n8n: N8n, served: Served) -> None:
    before = _expert_requests(served)
    done, _ = _execute(n8n, "werkE2eExperts01")
    printed = done.stdout + done.stderr
    assert done.returncode != 0, printed[-3000:]
    assert REFUSAL in printed, printed[-3000:]
    assert "NodeOperationError" in printed
    assert _expert_requests(served) == before, "the refusing node sent no request"
