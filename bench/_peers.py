"""Pinned PyPI peers in their own cached virtualenvs: those of ``bench/warm_restart.py`` (and
stillwarm's proxy).

Standard library only at import: the bench imports it, and each peer's own virtualenv runs it as a
script (``VENV/bin/python bench/_peers.py stillwarm-proxy ...``), where the host is not installed.

**Installs.** Each peer comes from PyPI, pinned, into its own virtualenv under
``${XDG_CACHE_HOME:-~/.cache}/werk/bench/<dist>-<version>/venv`` (:func:`ensure_peer`), installed
and marked by ``werk_host.testing.clients.client_venv``, so a second run only reads the marker.

* ``hearth-llm==0.1.1`` (MIT, stdlib only) ships a proxy, ``hearth serve``: it starts
  ``llama-server`` from ``PATH`` itself (``--model GGUF --ctx N --upstream-port P --cache-dir D``,
  llama-server flags after ``--``) with ``--slot-save-path D --parallel 1``, restores the saved
  snapshot of the longest message prefix into slot 0 before a chat request and saves the slot
  after it, under the hash of the conversation *including the reply* (``hearth/proxy.py``).
* ``stillwarm==0.1.1`` (MIT, stdlib only) is a library, ``stillwarm.Session`` (restore before
  request, save after response, a sidecar per save that refuses incompatible files, a 64-token
  greedy probe hashed at each save); its CLI only lists, inspects and prunes, and its docs say a
  long-running proxy is "deliberately out of v0.1 scope". :func:`stillwarm_proxy` is the smallest
  proxy over that library: it starts ``llama-server`` (``--slot-save-path D --parallel 1``) and
  serves ``/v1/chat/completions``, one conversation a session id (the model and the first
  message), restoring with ``Session.restore`` when another session (or none, after a restart)
  is in the slot, relaying llama-server's stream as it comes, and saving with ``Session.save``
  after the answer was sent (what ``Session.ask`` does, minus its blocking non-streamed
  ``/completion`` call and its save before returning). stillwarm's sidecar needs flash attention
  resolved (``on``/``off``, never ``auto``): the proxy passes ``-fa on``, which is what the other
  systems' default ``auto`` resolves to on this llama-server build (a slot file saved under
  ``auto`` restores under ``-fa on`` and is refused under ``-fa off``).
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

#: bench name -> (PyPI distribution, pinned version, extras)
PEERS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "hearth": ("hearth-llm", "0.1.1", ()),
    "stillwarm": ("stillwarm", "0.1.1", ()),
    # bench/relay_throughput.py's Python proxy peer: ``litellm --config`` (its ``proxy`` extra)
    "litellm-proxy": ("litellm", "1.80.0", ("proxy",)),
}


def say(message: str) -> None:
    print(f"[peers] {message}", file=sys.stderr, flush=True)


def bench_cache() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/werk/bench``."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "werk" / "bench"


def ensure_peer(name: str) -> Path:
    """The virtualenv of peer ``name`` with its pinned distribution installed, under
    :func:`bench_cache` (``werk_host.testing.clients.client_venv`` does the install)."""
    from werk_host.testing.clients import client_venv  # the host's interpreter only, never a peer's

    dist, version, extras = PEERS[name]
    return client_venv(dist, version, extras=extras, cache=bench_cache())


# -- stillwarm's proxy (runs in stillwarm's virtualenv) --------------------------------------------------------------


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except (OSError, urllib.error.HTTPError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"llama-server not healthy after {timeout:.0f} s")


def stillwarm_proxy(argv: Sequence[str]) -> int:
    """``_peers.py stillwarm-proxy``: llama-server + a ``/v1/chat/completions`` front on stillwarm."""
    import stillwarm  # the peer's own virtualenv

    parser = argparse.ArgumentParser(prog="_peers.py stillwarm-proxy")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--llama-server", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--model-sha256", required=True)
    parser.add_argument("--ctx", type=int, required=True)
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--flash-attn", choices=("on", "off"), default="on")
    parser.add_argument("--log", required=True)
    parser.add_argument("llama_args", nargs="*")
    args = parser.parse_args(argv)

    cache_dir = Path(args.cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    cmd = [args.llama_server, "-m", args.model, "--host", "127.0.0.1", "--port", str(args.upstream_port)]
    cmd += ["--slot-save-path", str(cache_dir), "--parallel", "1", "-c", str(args.ctx)]
    cmd += ["-fa", args.flash_attn, *args.llama_args]
    with open(args.log, "ab") as log:
        llama = subprocess.Popen(cmd, stdout=log, stderr=log)
    upstream = f"http://127.0.0.1:{args.upstream_port}"
    try:
        _wait_healthy(upstream, llama, 300)
        server = stillwarm.LlamaServer(upstream, timeout=7200)
        profile = stillwarm.ServerProfile(
            model_sha256=args.model_sha256,
            flash_attn=args.flash_attn,
            cache_type_k="f16",
            cache_type_v="f16",
            swa_full=False,
            ctx_size=args.ctx,
        )
        session = stillwarm.Session(server, profile, cache_dir=cache_dir, server_build_tag="werk-bench")
        state: dict[str, Any] = {"loaded": None}
        lock = threading.Lock()
        model_name = Path(args.model).name

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *fmt_args: Any) -> None:  # noqa: A002 (the stdlib's name)
                pass

            def _json(self, status: int, payload: object) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _send(self, data: bytes) -> bool:
                """Write to the client; False once it is gone (the answer is still read and saved)."""
                try:
                    self.wfile.write(data)
                    self.wfile.flush()
                    return True
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True
                    return False

            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                if self.path == "/health":
                    self._json(200, {"status": "ok"})
                else:
                    self._json(404, {"error": "not found"})

            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if self.path != "/v1/chat/completions" or not body.get("messages"):
                    self._json(404, {"error": "only /v1/chat/completions with messages"})
                    return
                with lock:
                    self._chat(body)

            def _chat(self, body: dict[str, Any]) -> None:
                first = json.dumps(body["messages"][0], sort_keys=True)
                sid = "conv-" + hashlib.sha256(f"{model_name}\0{first}".encode()).hexdigest()[:24]
                restored, note = False, ""
                if state["loaded"] != sid and (cache_dir / f"{sid}.bin").exists():
                    t0 = time.perf_counter()
                    try:
                        session.restore(sid)
                        restored = True
                        note = f"restored {(time.perf_counter() - t0) * 1000:.1f} ms"
                    except (stillwarm.RefusedRestore, stillwarm.ServerError, OSError, ValueError) as exc:
                        note = f"restore refused/failed: {exc}"
                state["loaded"] = sid
                forward = {**body, "id_slot": 0, "cache_prompt": True, "stream": True}
                conn = http.client.HTTPConnection("127.0.0.1", args.upstream_port, timeout=7200)
                conn.request("POST", "/v1/chat/completions", json.dumps(forward), {"Content-Type": "application/json"})
                resp = conn.getresponse()
                self.send_response(resp.status)
                self.send_header("Content-Type", resp.getheader("Content-Type") or "text/event-stream")
                self.send_header("X-Stillwarm-Restore", note or "none")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                parts: list[str] = []
                timings: dict[str, Any] = {}
                client = True
                while line := resp.readline():
                    client = client and self._send(b"%x\r\n%s\r\n" % (len(line), line))
                    if line.startswith(b"data: {"):
                        chunk = json.loads(line[6:])
                        timings.update(chunk.get("timings") or {})
                        for choice in chunk.get("choices") or []:
                            parts.append((choice.get("delta") or {}).get("content") or "")
                if client:
                    self._send(b"0\r\n\r\n")
                conn.close()
                if resp.status != 200:
                    return
                # After the answer went out, as Session.ask does before returning: the slot (prompt +
                # reply) is saved, then stillwarm's 64-token probe runs and the sidecar is written.
                rendered = server._request("POST", "/apply-template", {"messages": body["messages"]})["prompt"]
                session._live_prefix[sid] = rendered + "".join(parts)  # what Session.ask records
                try:
                    session.save(sid, generated_tokens=int(timings.get("predicted_n") or 1))
                except (stillwarm.ServerError, OSError, ValueError, KeyError) as exc:
                    print(f"stillwarm save failed: {exc}", file=sys.stderr, flush=True)
                if restored and (timings.get("prompt_n") or 0) > 64:
                    print(f"stillwarm: restore of {sid} ineffective: prompt_n {timings['prompt_n']}", file=sys.stderr)

        httpd = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
        httpd.daemon_threads = True
        signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=httpd.shutdown, daemon=True).start())
        httpd.serve_forever()
        httpd.server_close()
        return 0
    finally:
        stop_process(llama)


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """Terminate ``proc`` and wait for it; killed when it has not exited within 30 s."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    if sys.argv[1:2] == ["stillwarm-proxy"]:
        sys.exit(stillwarm_proxy(sys.argv[2:]))
    print("usage: _peers.py stillwarm-proxy ...", file=sys.stderr)
    sys.exit(2)
