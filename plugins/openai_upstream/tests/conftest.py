"""The upstream of these tests: a real llama-server (``WERK_LLAMA_SERVER``, else werk-llamacpp's
cached build) serving werk-llamacpp's generated tiny model under an alias, with an API key and,
when asked, under a path prefix. Without a llama-server the tests are skipped with the reason."""

from __future__ import annotations

import contextlib
import http.client
import os
import secrets
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from werk_llamacpp.binary import LlamaServerNotFound, find_llama_server
from werk_llamacpp.testing.testmodel import generate_model

from werk_host.plugin.process import free_port

#: The name the upstream serves its model under (``--alias``), the profile's ``model``.
SERVED = "upstream-model"


class Upstream:
    """One llama-server: ``start()`` (and again after ``stop()``, on the same port) and ``stop()``."""

    def __init__(self, binary: Path, model: Path, log: Path, *, prefix: str = "") -> None:
        self.binary, self.model, self.log, self.prefix = binary, model, log, prefix
        self.key = f"sk-upstream-{secrets.token_hex(12)}"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.prefix}/v1"

    def start(self) -> None:
        args = [str(self.binary), "-m", str(self.model), "--host", "127.0.0.1", "--port", str(self.port)]
        args += ["-a", SERVED, "-c", "1024", "-np", "2", "--no-warmup", "-t", "1"]
        if self.prefix:
            args += ["--api-prefix", self.prefix]
        # the key in the environment (LLAMA_API_KEY), never on the argv
        env = {**os.environ, "LLAMA_API_KEY": self.key}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited: {self.log.read_text(errors='replace')[-2000:]}")
            if self._healthy():
                return
            time.sleep(0.1)
        raise RuntimeError("llama-server did not become healthy in 60 s")

    def _healthy(self) -> bool:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
        try:
            # under a prefix, llama-server's /health is not public: it takes the key
            conn.request("GET", f"{self.prefix}/health", headers={"Authorization": f"Bearer {self.key}"})
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@pytest.fixture(scope="session")
def llama_server_path() -> Path:
    try:
        return find_llama_server(use_path=False)
    except LlamaServerNotFound:
        pytest.skip("no llama-server binary: set WERK_LLAMA_SERVER or run scripts/build-llama-server.sh")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_model(tmp_path_factory.mktemp("model") / "tiny.gguf")


@pytest.fixture(scope="module")
def upstream(llama_server_path: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    """A llama-server with an API key, shared by one test module."""
    server = Upstream(llama_server_path, tiny_model, tmp_path_factory.mktemp("upstream") / "llama.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


class TlsFront:
    """HTTPS in front of a plain-HTTP server: a TLS listener on 127.0.0.1 whose connections are
    piped to ``127.0.0.1:target`` (llama-server here is built without TLS). The certificate is a
    fresh self-signed one for 127.0.0.1, in ``ca_file``."""

    def __init__(self, target: int, directory: Path) -> None:
        openssl = shutil.which("openssl")
        if openssl is None:
            pytest.skip("no openssl command to make a test certificate")
        self.ca_file, key = directory / "cert.pem", directory / "key.pem"
        subprocess.run(
            [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
             str(self.ca_file), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
            check=True, capture_output=True,
        )  # fmt: skip
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.ca_file, key)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.target, self.context = target, context
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            client = self.context.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError):
            raw.close()  # a client that does not trust the certificate ends the handshake
            return
        server = socket.create_connection(("127.0.0.1", self.target))

        def pipe(a: socket.socket, b: socket.socket) -> None:
            try:
                while data := a.recv(65536):
                    b.sendall(data)
            except OSError:
                pass
            finally:
                for s in (a, b):
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)

        threading.Thread(target=pipe, args=(server, client), daemon=True).start()
        pipe(client, server)
        client.close()
        server.close()

    def close(self) -> None:
        self.listener.close()
