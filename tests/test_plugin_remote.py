"""werk_host.plugin.remote and the relay's TLS and path prefix (docs/plugin-kit.md, "Backends
without local files"), and what a factory's ``validate_options`` receives ("Options").

The servers here are real threaded HTTP servers in this process; the whole plugin built on the
module is tested against a real llama-server in plugins/openai_upstream/tests.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from pydantic import JsonValue

from werk_host import hookimpl
from werk_host.plugin import AdapterFactory, ErrorCode, HostConfig, ModelManifest, WerkError
from werk_host.plugin.http import ConnectionPool, forward, post_json
from werk_host.plugin.process import free_port
from werk_host.plugin.remote import Endpoint, Failure, Remote, RemoteSettings, check_options, remote_settings
from werk_host.testing.hosts import make_host

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-remote-0123456789abcdef"


@pytest.fixture
def server() -> Iterator[tuple[int, list[tuple[str, str | None]]]]:
    """A server answering every path under ``/api/v1`` (``GET .../models`` lists ``m``), 401
    without the key; it records each (path, Authorization) it saw."""
    seen: list[tuple[str, str | None]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def answer(self, status: int, doc: object) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def handle_any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            seen.append((self.path, self.headers.get("Authorization")))
            if self.headers.get("Authorization") != f"Bearer {KEY}":
                self.answer(401, {"error": {"message": "Invalid API Key"}})
            elif not self.path.startswith("/api/v1/"):
                self.answer(404, {"error": "no such route"})
            elif self.path.endswith("/models"):
                self.answer(200, {"object": "list", "data": [{"id": "m"}]})
            elif self.path.endswith("/boom"):
                self.answer(500, {"error": "upstream detail"})
            else:
                self.answer(200, {"ok": True, "path": self.path})

        do_GET = do_POST = handle_any

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1], seen
    finally:
        httpd.shutdown()
        httpd.server_close()


# -- endpoints and options ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "endpoint"),
    [
        ("http://10.0.0.5:8000", Endpoint(False, "10.0.0.5", 8000, "/v1")),
        ("https://api.example.com/openai/v1/", Endpoint(True, "api.example.com", 443, "/openai/v1")),
        ("http://gpu-box/v1", Endpoint(False, "gpu-box", 80, "/v1")),
    ],
)
def test_an_endpoint_is_scheme_host_port_and_base_path(url: str, endpoint: Endpoint) -> None:
    assert Endpoint.parse(url) == endpoint


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://host/v1", "http:// or https://"),
        ("https://user:secret@host/v1", "credentials"),
        ("http://host/v1?key=x", "query"),
        ("http://host:99999/v1", "port"),
    ],
)
def test_an_endpoint_that_is_not_one_is_refused_with_why(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Endpoint.parse(url)


def test_the_key_comes_from_the_environment_or_a_file(tmp_path: Path) -> None:
    endpoint = Endpoint.parse("http://h/v1")
    assert RemoteSettings(endpoint, api_key_env="K").api_key({"K": KEY}) == KEY
    with pytest.raises(ValueError, match="the environment variable K is not set"):
        RemoteSettings(endpoint, api_key_env="K").api_key({})
    keyfile = tmp_path / "key"
    keyfile.write_text(f"{KEY}\nignored\n")
    assert RemoteSettings(endpoint, api_key_file=keyfile).api_key({}) == KEY
    with pytest.raises(ValueError, match="api_key_file: the file cannot be read"):
        RemoteSettings(endpoint, api_key_file=tmp_path / "missing").api_key({})
    assert RemoteSettings(endpoint).api_key({}) is None


def test_options_are_checked_with_the_option_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    check_options({})  # the endpoint may come from a server-wide --backend-option
    with pytest.raises(ValueError, match="unknown option"):
        check_options({"endpont": "http://h"})
    with pytest.raises(ValueError, match="endpoint is not an http"):
        check_options({"endpoint": "h:1"})
    with pytest.raises(ValueError, match="api_key_env: the environment variable NO_SUCH_KEY_VAR is not set"):
        check_options({"endpoint": "http://h", "api_key_env": "NO_SUCH_KEY_VAR"})
    with pytest.raises(ValueError, match="not both"):
        check_options({"endpoint": "http://h", "api_key_env": "A", "api_key_file": "/k"})
    with pytest.raises(ValueError, match="endpoint is missing"):
        remote_settings({})
    assert remote_settings({"endpoint": "http://h:1", "mine": 1}, extra=("mine",)).endpoint.port == 1


# -- the relay under a prefix, the probe, the failures ----------------------------------------------


def test_the_relay_sends_every_path_under_the_prefix(server: tuple[int, list[tuple[str, str | None]]]) -> None:
    port, seen = server
    pool = ConnectionPool("127.0.0.1", port, api_key=KEY, prefix="/api/v1")
    try:
        assert post_json(pool, "/tokenize", {})["path"] == "/api/v1/tokenize"
        response = forward(pool, "/chat/completions", {"messages": []})
        assert response.status == 200 and json.loads(b"".join(response.body))["path"] == "/api/v1/chat/completions"
        response.close()
    finally:
        pool.close()
    assert [p for p, _ in seen] == ["/api/v1/tokenize", "/api/v1/chat/completions"]
    with pytest.raises(ValueError, match="prefix"):
        ConnectionPool("127.0.0.1", port, prefix="api/")


def test_a_probe_lists_the_models_or_names_the_failure(server: tuple[int, list[tuple[str, str | None]]]) -> None:
    port, _ = server
    endpoint = f"http://127.0.0.1:{port}/api/v1"
    good = Remote(remote_settings({"endpoint": endpoint, "api_key_env": "K"}), environ={"K": KEY})
    assert good.probe("m").models == ("m",) and good.probe("m").ok
    assert good.probe("other").failure is Failure.MODEL
    wrong = Remote(remote_settings({"endpoint": endpoint, "api_key_env": "K"}), environ={"K": "sk-wrong"})
    probe = wrong.probe("m")
    assert probe.failure is Failure.KEY
    error = wrong.error(probe)
    assert (error.code, error.message) == (ErrorCode.UNAVAILABLE, "the upstream refused the API key (api_key_env K)")
    assert not error.retryable
    with pytest.raises(WerkError, match="refused the API key"):
        wrong.forward("/chat/completions", {})  # a 401 on a request says so too
    down = Remote(remote_settings({"endpoint": f"http://127.0.0.1:{free_port()}"}))
    assert down.probe().failure is Failure.REFUSED
    with pytest.raises(WerkError, match=r"is not answering \(the connection was refused\)"):
        down.ready()
    with pytest.raises(WerkError, match=r"failed \(status 500\)") as failed:
        good.forward("/boom", {})
    assert "upstream detail" not in failed.value.message
    for remote in (good, wrong, down):
        assert KEY not in repr(remote) and KEY not in repr(remote.pool)
        remote.close()


def test_tls_to_a_plain_server_is_a_tls_failure(server: tuple[int, list[tuple[str, str | None]]]) -> None:
    port, _ = server
    remote = Remote(remote_settings({"endpoint": f"https://127.0.0.1:{port}/api/v1"}))
    probe = remote.probe()
    assert probe.failure is Failure.TLS
    assert "cannot be reached over TLS" in remote.error(probe).message
    remote.close()


# -- validate_options: what the host passes, as docs/plugin-kit.md ("Options") says ------------------


class RecordingPlugin:
    """A backend whose factory records what ``validate_options`` and ``create`` receive."""

    def __init__(self) -> None:
        self.validated: list[dict[str, JsonValue]] = []
        self.created: list[dict[str, Any]] = []

    def validate(self, options: Mapping[str, JsonValue]) -> None:
        self.validated.append(dict(options))

    def create(self, config: HostConfig, manifest: ModelManifest | None) -> Any:
        self.created.append(dict(config.backend_options.get("rec", {})))
        raise WerkError(ErrorCode.UNAVAILABLE, "recorded")

    @hookimpl
    def werk_adapter_factories(self, config: HostConfig) -> list[AdapterFactory]:
        return [AdapterFactory("rec", lambda m: False, self.create, validate_options=self.validate)]


def test_validate_options_gets_the_instances_own_options_only(tmp_path: Path) -> None:
    profile = tmp_path / "profile.toml"
    profile.write_text(
        '[[instance]]\nid = "r"\nmodel = "m"\nbackend = "rec"\nendpoint = "http://127.0.0.1:9/v1"\n'
        'api_key_env = "K"\npreload = true\noptions = { own = 1 }\n'
    )
    recorder = RecordingPlugin()
    host = make_host(
        tmp_path / "home",
        plugin=recorder,
        plugin_name="rec",
        with_model=False,
        profile=profile,
        backend_options={"server_wide": 2},
    )
    host.close()
    instance_options = {"own": 1, "endpoint": "http://127.0.0.1:9/v1", "api_key_env": "K"}
    assert recorder.validated == [instance_options]  # not the server-wide --backend-option
    assert recorder.created == [{"server_wide": 2, **instance_options}]  # create sees both
    kit = " ".join((ROOT / "docs" / "plugin-kit.md").read_text(encoding="utf-8").split())
    assert "the host calls it with the instance's own options only" in kit
    assert "never with the server-wide `--backend-option` values" in kit
