"""Browser safety (docs/operations.md, "Browser safety"; werk_host/http/browser.py).

In process, over the app: JSON routes refuse other media types with 415 in each API family's
error shape, a body without ``Content-Type`` still works; a foreign ``Host`` (DNS rebinding)
and a foreign ``Origin`` are 403 in each shape, before anything is read or done; the bound
address, loopback names, ``--allowed-hosts`` and, bound to every interface, IP literals pass;
same-origin requests pass; an ``--allowed-origins`` origin (exact or pattern) gets CORS headers
and its preflight a 204 without a key, while its requests still need the key; no CORS header
for anyone else; every ``/ui`` answer, an unrouted 404 too, carries the page's security headers.

In a real headless chromium (``scripts/setup-browser.sh``) against one real key-less
``werk serve`` (the default a local user runs) with a real llama-server and the generated tiny
GGUF: a page on another origin sends what a page can send without a preflight (``no-cors``
``fetch`` with ``text/plain``, form-encoded and multipart bodies, an auto-submitted
``text/plain`` form) to a chat, both prunes, the instance's unload and the Ollama unload idiom:
the host's own request counters show every one refused, and the instance is still loaded; its
CORS ``fetch`` cannot read an answer. A page reached under a rebound name is refused, its own
same-origin calls too. ``/ui`` and its same-origin calls work; a page on an allowed origin reads
its answers. Without chromium or llama-server those tests skip with the reason.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import falcon.testing
import pytest

from tests.browser_support import chromium
from werk_host.http.ui import CONTENT_SECURITY_POLICY
from werk_host.server import Host
from werk_host.testing.hosts import MODEL, backend_host, serve_process

KEY = "sk-werk-browser-0123456789"
FOREIGN = "http://evil.example"
ALLOWED = "http://allowed.example:3000"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
#: (path, body) of a request in each API family, for the refusals' error shapes.
FAMILIES = {
    "werk": ("/werk/v1/states/prune", {"selector": {"kind": "all"}}),
    "openai": ("/v1/chat/completions", CHAT),
    "anthropic": ("/v1/messages", {**CHAT, "max_tokens": 1}),
    "ollama": ("/api/chat", {"model": MODEL, "messages": CHAT["messages"], "stream": False}),
}


def _shape(family: str, document: Any) -> str:
    """The error code or type an API family's error body names."""
    if family == "werk":
        return str(document["error"]["code"])
    if family == "anthropic":
        assert document["type"] == "error"
        return str(document["error"]["type"])
    if family == "ollama":
        assert isinstance(document["error"], str) and document["error"]
        return "ollama"
    return str(document["error"]["code"])


@pytest.fixture
def local(home: Path) -> Iterator[Host]:
    """A key-less host, as a local user starts it, allowing one extra name and origin."""
    host, _plugin = backend_host(home, allowed_hosts=("werk.lan",), allowed_origins=(ALLOWED, "http://*.trusted:*"))
    yield host
    host.close()


@pytest.fixture
def app(local: Host) -> falcon.testing.TestClient:
    return falcon.testing.TestClient(local.app)


def _post(app: falcon.testing.TestClient, path: str, body: object, **headers: str) -> falcon.testing.Result:
    return app.simulate_post(path, body=json.dumps(body).encode(), headers=headers)


# -- media types -------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "content_type",
    ["text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "*/*"],
)
def test_a_body_that_is_not_json_by_its_media_type_is_415(
    app: falcon.testing.TestClient, family: str, content_type: str
) -> None:
    path, body = FAMILIES[family]
    result = _post(app, path, body, **{"Content-Type": content_type})
    assert result.status_code == 415, result.text
    code = _shape(family, result.json)
    assert code in ("invalid_request", "invalid_request_error", "ollama")
    assert "Content-Type: application/json" in result.text


@pytest.mark.parametrize("content_type", [None, "application/json", "application/json; charset=utf-8"])
def test_json_and_unlabelled_bodies_are_read(app: falcon.testing.TestClient, content_type: str | None) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    result = app.simulate_post("/v1/chat/completions", body=json.dumps(CHAT).encode(), headers=headers)
    assert result.status_code == 200, result.text


def test_an_empty_form_post_to_an_action_is_refused_before_it_acts(app: falcon.testing.TestClient) -> None:
    # an HTML form with no fields posts an empty form-encoded body
    result = app.simulate_post(
        f"/werk/v1/deployments/{MODEL}/actions", headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert result.status_code == 415


# -- Host ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_a_rebound_host_name_is_403_in_each_shape(app: falcon.testing.TestClient, family: str) -> None:
    path, body = FAMILIES[family]
    result = app.simulate_post(
        path,
        body=json.dumps(body).encode(),
        host="rebind.attacker.example",
        headers={"Origin": "http://rebind.attacker.example"},
    )
    assert result.status_code == 403, result.text
    assert _shape(family, result.json) in ("forbidden", "permission_error", "ollama")
    assert "allowed-hosts" in result.text


@pytest.mark.parametrize("name", ["localhost", "127.0.0.1", "[::1]", "werk.lan", "app.localhost", "LOCALHOST"])
def test_loopback_bound_and_allowed_names_pass(app: falcon.testing.TestClient, name: str) -> None:
    assert app.simulate_get("/werk/v1/info", host=name).status_code == 200


@pytest.mark.parametrize("name", ["192.168.1.20", "evil.example", "localhost.evil.example"])
def test_other_names_and_addresses_are_403_when_bound_to_loopback(app: falcon.testing.TestClient, name: str) -> None:
    assert app.simulate_get("/werk/v1/info", host=name).status_code == 403


def test_bound_to_every_interface_ip_literals_pass_and_names_do_not(home: Path) -> None:
    host, _plugin = backend_host(home, host="0.0.0.0")
    try:
        client = falcon.testing.TestClient(host.app)
        assert client.simulate_get("/werk/v1/info", host="192.168.1.20").status_code == 200
        assert client.simulate_get("/werk/v1/info", host="[fe80::1]").status_code == 200
        assert client.simulate_get("/werk/v1/info", host="rebind.attacker.example").status_code == 403
    finally:
        host.close()


def test_a_star_allows_every_host_name(home: Path) -> None:
    host, _plugin = backend_host(home, allowed_hosts=("*",))
    try:
        client = falcon.testing.TestClient(host.app)
        assert client.simulate_get("/werk/v1/info", host="proxy.example.com").status_code == 200
    finally:
        host.close()


# -- Origin and CORS -------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("origin", [FOREIGN, "null", "http://localhost:9999", "http://allowed.example:3001"])
def test_a_foreign_origin_is_403_in_each_shape(app: falcon.testing.TestClient, family: str, origin: str) -> None:
    path, body = FAMILIES[family]
    result = _post(app, path, body, Origin=origin, **{"Content-Type": "application/json"})
    assert result.status_code == 403, result.text
    assert _shape(family, result.json) in ("forbidden", "permission_error", "ollama")
    assert "access-control-allow-origin" not in result.headers


def test_same_origin_passes_without_cors_headers(app: falcon.testing.TestClient) -> None:
    result = _post(app, "/v1/chat/completions", CHAT, Origin="http://localhost", **{"Content-Type": "application/json"})
    assert result.status_code == 200
    assert "access-control-allow-origin" not in result.headers
    ported = app.simulate_get("/werk/v1/info", host="localhost", headers={"Origin": "http://localhost:80"})
    assert ported.status_code == 200


@pytest.mark.parametrize("origin", [ALLOWED, "http://ui.trusted:8080"])
def test_an_allowed_origin_gets_cors_headers_and_a_preflight(app: falcon.testing.TestClient, origin: str) -> None:
    preflight = app.simulate_options(
        "/v1/chat/completions",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == origin
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert preflight.headers["access-control-allow-headers"] == "authorization, content-type"
    result = _post(app, "/v1/chat/completions", CHAT, Origin=origin, **{"Content-Type": "application/json"})
    assert result.status_code == 200
    assert result.headers["access-control-allow-origin"] == origin
    assert "Origin" in result.headers["vary"]
    assert "X-Werk-Request-Id" in result.headers["access-control-expose-headers"]


def test_a_foreign_preflight_is_403(app: falcon.testing.TestClient) -> None:
    result = app.simulate_options(
        "/werk/v1/states/prune", headers={"Origin": FOREIGN, "Access-Control-Request-Method": "POST"}
    )
    assert result.status_code == 403
    assert "access-control-allow-origin" not in result.headers


def test_with_keys_an_allowed_origin_still_needs_the_key(home: Path) -> None:
    host, _plugin = backend_host(home, api_keys=(KEY,), allowed_origins=(ALLOWED,))
    try:
        client = falcon.testing.TestClient(host.app)
        headers = {"Origin": ALLOWED, "Content-Type": "application/json"}
        preflight = client.simulate_options(
            "/v1/chat/completions", headers={"Origin": ALLOWED, "Access-Control-Request-Method": "POST"}
        )
        assert preflight.status_code == 204  # browsers send preflights without credentials
        assert client.simulate_post("/v1/chat/completions", body=json.dumps(CHAT), headers=headers).status_code == 401
        keyed = {**headers, "Authorization": f"Bearer {KEY}"}
        assert client.simulate_post("/v1/chat/completions", body=json.dumps(CHAT), headers=keyed).status_code == 200
    finally:
        host.close()


# -- /ui -------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/ui", "/ui/nope.js", "/ui/a/b", "/ui/..%2f..%2fetc"])
def test_every_ui_answer_carries_the_security_headers(app: falcon.testing.TestClient, path: str) -> None:
    result = app.simulate_get(path)
    assert result.status_code in (200, 404)
    assert result.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert result.headers["x-frame-options"] == "DENY"
    assert result.headers["referrer-policy"] == "no-referrer"


# -- a real browser ----------------------------------------------------------------------------

#: Generous bound on each wait for the browser (never a pass/fail threshold on speed).
WAIT_S = 90


class _Pages(http.server.ThreadingHTTPServer):
    """Another site: serves one page (``/``), the text the test sets."""

    page = b""


class _PageHandler(http.server.BaseHTTPRequestHandler):
    server: _Pages

    def do_GET(self) -> None:
        body = self.server.page
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def pages() -> Iterator[_Pages]:
    server = _Pages(("127.0.0.1", 0), _PageHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, llama_server: str) -> Iterator[str]:
    """One key-less ``werk serve`` with a preloaded llama.cpp instance ``tiny`` of the generated
    GGUF; pages of ``allowed.test`` (any port) may call it."""
    testmodel = pytest.importorskip("werk_llamacpp.testing.testmodel", reason="the llama.cpp plugin is not installed")
    base = tmp_path_factory.mktemp("browser")
    model = testmodel.generate_model(base / "tiny.gguf")
    profile = base / "deployments.toml"
    profile.write_text(f'[[instance]]\nid = "tiny"\nmodel = "{model}"\npreload = true\ndefault = true\n')
    home = base / "home"
    home.mkdir(mode=0o700)
    env = {"WERK_LLAMA_SERVER": llama_server, "WERK_ALLOWED_ORIGINS": "http://allowed.test:*"}
    with serve_process(home, "--profile", str(profile), env=env, drop=("WERK_LLAMA_ARGS", "WERK_API_KEYS")) as served:
        yield served.url


@pytest.fixture(scope="module")
def chrome() -> Iterator[Any]:
    """A headless chromium that resolves ``rebind.test`` and ``allowed.test`` to 127.0.0.1."""
    yield from chromium(
        "--host-resolver-rules=MAP rebind.test 127.0.0.1, MAP allowed.test 127.0.0.1", script_timeout_s=WAIT_S
    )


def _counts(url: str) -> dict[tuple[str, str, str], float]:
    """``werk_http_requests_total`` by (route, method, status), read as a local client does."""
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=30) as answer:
        text = answer.read().decode()
    counts: dict[tuple[str, str, str], float] = {}
    for line in text.splitlines():
        if not line.startswith("werk_http_requests_total{"):
            continue
        labels, _, value = line.partition("} ")
        fields = dict(part.split("=", 1) for part in labels.removeprefix("werk_http_requests_total{").split(","))
        key = (fields["route"].strip('"'), fields["method"].strip('"'), fields["status"].strip('"'))
        counts[key] = counts.get(key, 0.0) + float(value)
    return counts


def _state(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url + "/werk/v1/deployments", timeout=30) as answer:
        listed = json.loads(answer.read())["data"]
    return str(next(i for i in listed["inventory"] if i["id"] == "tiny")["state"])


#: What a foreign page sends without a preflight: (path, JSON body) to each route, by fetch.
ATTACKS = [
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
    ("/werk/v1/states/prune", {"selector": {"kind": "all", "confirm": True}, "dry_run": False}),
    ("/werk/v1/prompt-caches/prune", {"selector": {"kind": "all", "confirm": True}, "dry_run": False}),
    ("/werk/v1/deployments/tiny/actions", {"action": "unload"}),
    ("/api/generate", {"model": "tiny", "keep_alive": 0}),
]
TYPES = ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]


def _attack_page(target: str) -> bytes:
    shots = json.dumps([[target + path, json.dumps(body)] for path, body in ATTACKS])
    return f"""<!doctype html><html><body>
<form id="form" method="POST" enctype="text/plain" target="sink" action="{target}/werk/v1/deployments/tiny/actions">
<input name='{{"action": "unload", "x": "' value='"}}'></form><iframe name="sink"></iframe>
<script>
window.results = [];
async function run() {{
  for (const [url, body] of {shots}) {{
    for (const type of {json.dumps(TYPES)}) {{
      try {{ await fetch(url, {{method: "POST", mode: "no-cors", headers: {{"Content-Type": type}}, body}});
            results.push("sent"); }}
      catch (e) {{ results.push("error"); }}
    }}
  }}
  try {{ const r = await fetch("{target}/werk/v1/info"); results.push("read " + r.status); }}
  catch (e) {{ results.push("unreadable"); }}
  document.getElementById("form").submit();
  setTimeout(() => {{ document.title = "done"; }}, 1500);
}}
run();
</script></body></html>""".encode()


def _wait_title(driver: Any, title: str) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, WAIT_S).until(lambda d: d.title == title, f"the page never reached {title!r}")


def test_a_foreign_page_cannot_drive_a_keyless_host(chrome: Any, live: str, pages: _Pages) -> None:
    before = _counts(live)
    pages.page = _attack_page(live)
    chrome.get(f"http://127.0.0.1:{pages.server_address[1]}/")
    _wait_title(chrome, "done")
    assert chrome.execute_script("return window.results")[-1] == "unreadable"
    after = _counts(live)
    sent = {k: v - before.get(k, 0.0) for k, v in after.items() if k[1] == "POST" and v > before.get(k, 0.0)}
    refused = sum(v for (_r, _m, status), v in sent.items() if status in ("403", "415"))
    # every fetch and the form reached the host and was refused; nothing else was answered
    assert refused == len(ATTACKS) * len(TYPES) + 1, sent
    assert all(status in ("403", "415") for (_r, _m, status) in sent), sent
    assert _state(live) == "ready"


def test_a_page_under_a_rebound_name_is_refused(chrome: Any, live: str) -> None:
    port = live.rsplit(":", 1)[1]
    chrome.get(f"http://rebind.test:{port}/ui")
    assert "not allowed" in chrome.page_source
    status = chrome.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch('/werk/v1/deployments').then(r => done(r.status), e => done(String(e)));"
    )
    assert status == 403


def test_the_ui_and_its_same_origin_calls_work(chrome: Any, live: str) -> None:
    chrome.get(live + "/ui")
    assert chrome.title
    script = (
        "const done = arguments[arguments.length - 1];"
        "fetch('/werk/v1/states/prune', {method: 'POST', headers: {'Content-Type': 'application/json'},"
        " body: JSON.stringify({selector: {kind: 'all', confirm: true}, dry_run: true})}).then(r => done(r.status), e => done(String(e)));"
    )
    assert chrome.execute_async_script(script) == 200
    assert _state(live) == "ready"


def test_a_page_on_an_allowed_origin_reads_its_answers(chrome: Any, live: str, pages: _Pages) -> None:
    pages.page = b"<!doctype html><title>allowed</title>"
    chrome.get(f"http://allowed.test:{pages.server_address[1]}/")
    script = (
        "const done = arguments[arguments.length - 1];"
        f"fetch('{live}/v1/chat/completions', {{method: 'POST', headers: {{'Content-Type': 'application/json'}},"
        " body: JSON.stringify({model: 'tiny', messages: [{role: 'user', content: 'hi'}], max_tokens: 1})})"
        ".then(r => r.json()).then(j => done(j.object), e => done(String(e)));"
    )
    assert chrome.execute_async_script(script) == "chat.completion"
