"""Screenshot of a Werk workflow in the real n8n editor (docs/n8n-workflow.png).

Not a test: ``cd integrations/n8n/e2e && /work/main/.venv/bin/python screenshot.py [OUT.png]``.
It starts ``n8n start`` (from ``scripts/setup-n8n.sh``) with the built package in
``N8N_CUSTOM_EXTENSIONS``, imports a workflow (Manual Trigger -> Werk Chat, and Manual Trigger ->
Werk Prefill -> Werk Decode), sets up n8n's owner through its REST API, and opens the workflow in
headless chromium (selenium, as tests/test_ui.py) with the owner's cookie.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import test_n8n_workflow as e2e
from selenium import webdriver

EMAIL = "owner@example.com"
PASSWORD = "Werk-n8n-screenshot-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def showcase() -> dict:
    chat = e2e.chat_workflow()
    flow = e2e.prefill_decode_workflow()
    trigger = chat["nodes"][0]
    chat_node = chat["nodes"][1]
    chat_node["position"] = [240, -160]
    nodes = [trigger, chat_node, *flow["nodes"][1:]]
    main = flow["connections"][trigger["name"]]["main"][0] + chat["connections"][trigger["name"]]["main"][0]
    connections = {**flow["connections"], trigger["name"]: {"main": [main]}}
    return {**flow, "id": "werkShowcase0001", "name": "Werk host in n8n", "nodes": nodes, "connections": connections}


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else e2e.ROOT / "docs" / "n8n-workflow.png"
    setup = ["bash", str(e2e.ROOT / "scripts" / "setup-n8n.sh")]
    done = subprocess.run(setup, capture_output=True, text=True, check=True)
    binary = Path(done.stdout.strip().splitlines()[-1])
    folder = Path(tempfile.mkdtemp(prefix="werk-n8n-shot-"))
    extensions = folder / "extensions"
    e2e._install_package(e2e.PACKAGE, binary, extensions)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TMPDIR")}
    env.update(
        HOME=str(folder),
        N8N_USER_FOLDER=str(folder),
        N8N_CUSTOM_EXTENSIONS=str(extensions),
        N8N_ENCRYPTION_KEY="werk-n8n-screenshot",
        N8N_DIAGNOSTICS_ENABLED="false",
        N8N_VERSION_NOTIFICATIONS_ENABLED="false",
        N8N_TEMPLATES_ENABLED="false",
        N8N_PERSONALIZATION_ENABLED="false",
        N8N_RUNNERS_ENABLED="false",
        N8N_EXPRESSION_ENGINE="legacy",
        N8N_SECURE_COOKIE="false",
        N8N_PORT=str(port),
        N8N_HOST="127.0.0.1",
    )
    creds = folder / "credentials.json"
    data = {"baseUrl": "http://127.0.0.1:11434", "apiKey": "sk-..."}
    creds.write_text(json.dumps([{"id": e2e.CREDENTIAL_ID, "name": "Werk (local)", "type": "werkApi", "data": data}]))
    flows = folder / "workflows.json"
    flows.write_text(json.dumps([showcase()]))
    for args in (["import:credentials", f"--input={creds}"], ["import:workflow", f"--input={flows}"]):
        subprocess.run([str(binary), *args], env=env, check=True, capture_output=True, timeout=300)
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([str(binary), "start"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                with urllib.request.urlopen(f"{base}/healthz/readiness", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("n8n start did not become ready")
            time.sleep(1)
        body = json.dumps({"email": EMAIL, "firstName": "Werk", "lastName": "Owner", "password": PASSWORD}).encode()
        headers = {"Content-Type": "application/json"}
        req = urllib.request.Request(f"{base}/rest/owner/setup", data=body, headers=headers)
        while True:  # the REST routes come up a little after readiness
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    cookie = r.headers["Set-Cookie"].split(";", 1)[0]
                    break
            except urllib.error.HTTPError as error:
                if error.code != 404 or time.monotonic() > deadline:
                    raise
                time.sleep(1)
        name, value = cookie.split("=", 1)
        options = webdriver.ChromeOptions()
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1360,800"):
            options.add_argument(arg)
        options.binary_location = "/usr/bin/chromium"
        driver = webdriver.Chrome(options=options, service=webdriver.ChromeService("/usr/bin/chromedriver"))
        try:
            driver.get(f"{base}/favicon.ico")
            driver.add_cookie({"name": name, "value": value, "path": "/"})
            driver.get(f"{base}/workflow/werkShowcase0001")
            time.sleep(12)  # the editor's canvas renders after its bundles load
            out.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(out))
        finally:
            driver.quit()
        print(out)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    main()
