"""The compat translators are imported on their routes' first request, not when the app is built
(docs/operations.md, "Where the start-up time goes").

Checked in a fresh interpreter: a host is built (no backend), the translator modules present
are listed, then the first requests of every Anthropic, OpenAI Responses and Ollama route arrive
at once from several threads (racing the import), each with a body the translator refuses.
Every one must get its API's own error shape, and the translators must be imported by then.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROBE = """
import json, sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import falcon.testing

from werk_host.config import HostConfig
from werk_host.server import build_host

host = build_host(HostConfig(home=Path(sys.argv[1])), load_entry_points=False)
built = sorted(m for m in sys.modules if m.startswith("werk_host.compat."))
client = falcon.testing.TestClient(host.app)
paths = json.loads(sys.argv[2])

def ask(path):
    result = client.simulate_post(path, json={"model": 3}, host="localhost")
    return [path, result.status_code, result.json]

with ThreadPoolExecutor(max_workers=len(paths) * 2) as pool:
    answers = list(pool.map(ask, paths * 2))
host.close()
after = sorted(m for m in sys.modules if m.startswith("werk_host.compat."))
print(json.dumps({"built": built, "answers": answers, "after": after}))
"""

#: The translator modules a start must not import.
TRANSLATORS = ("werk_host.compat.anthropic", "werk_host.compat.responses", "werk_host.compat.ollama")
ANTHROPIC = ("/v1/messages", "/v1/messages/count_tokens")
OLLAMA = ("/api/chat", "/api/generate", "/api/show", "/api/embed", "/api/embeddings")
RESPONSES = ("/v1/responses",)


def test_the_translators_wait_for_their_first_request(tmp_path: Path) -> None:
    paths = [*ANTHROPIC, *OLLAMA, *RESPONSES]
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "home"), json.dumps(paths)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    early = [module for module in TRANSLATORS if module in found["built"]]
    assert not early, f"building the app imported {early}"
    for path, status, doc in found["answers"]:
        assert status == 400, (path, doc)
        if path in ANTHROPIC:
            assert doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error", doc
        elif path in OLLAMA:
            assert set(doc) == {"error"} and "model" in doc["error"], doc
        else:
            assert doc["error"]["code"] == "invalid_request" and doc["error"]["type"] == "invalid_request_error", doc
    assert set(TRANSLATORS) <= set(found["after"])
