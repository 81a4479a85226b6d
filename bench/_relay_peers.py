"""The peers ``bench/relay_throughput.py`` measures beside Werk on the same upstream.

* **nginx** from Debian (``apt-get download nginx``, the package's binary extracted with
  ``dpkg-deb -x`` and cached by version under ``${XDG_CACHE_HOME:-~/.cache}/werk/bench/nginx-<version>/``;
  nothing is installed system-wide): one worker process, an SSE reverse proxy with
  ``proxy_buffering off`` and HTTP/1.1 upstream keep-alive, the way a compiled relay is put in
  front of an event stream. Its figure is the compiled reference.
* **The LiteLLM proxy** (``litellm[proxy]==1.80.0`` from PyPI in its own cached virtualenv,
  ``bench/_peers.py``): ``litellm --config`` with one ``openai/`` model whose ``api_base`` is the
  upstream, one worker, ``drop_params`` (it refuses llama-server's ``ignore_eos`` otherwise, so
  its answers may end early; CPU is counted per token the answers report).

Each context manager yields ``(port, pid)``; :func:`tree_cpu_s` is the CPU time of that process
and every process under it (nginx's workers).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from bench._peers import bench_cache, ensure_peer, say, stop_process


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` and all its descendants so far."""
    import psutil  # type: ignore[import-untyped]

    total = 0.0
    with suppress(psutil.Error):
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            with suppress(psutil.Error):
                times = proc.cpu_times()
                total += times.user + times.system
    return total


def nginx_binary() -> Path:
    """Debian's nginx binary, downloaded and extracted once (module docstring)."""
    version = (
        subprocess.run(["apt-cache", "policy", "nginx"], check=True, capture_output=True, text=True)
        .stdout.split("Candidate:")[1]
        .split()[0]
    )
    base = bench_cache() / f"nginx-{version}"
    binary = base / "root" / "usr" / "sbin" / "nginx"
    if binary.exists():
        return binary
    say(f"nginx {version}: apt-get download, dpkg-deb -x into {base}")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["apt-get", "download", f"nginx={version}"], check=True, cwd=tmp, stdout=sys.stderr)
        deb = next(Path(tmp).glob("nginx_*.deb"))
        staging = base / "root.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(staging)], check=True)
        staging.rename(base / "root")
    return binary


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str, path: str = "/") -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode})")
        with suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2):
            return
        time.sleep(0.3)
    raise RuntimeError(f"{what} did not answer on {port}")


@contextmanager
def nginx_relay(upstream: int, work: Path) -> Iterator[tuple[int, int]]:
    """(port, master pid) of nginx proxying to ``127.0.0.1:upstream`` (module docstring)."""
    binary, port = nginx_binary(), _free_port()
    prefix = work / "nginx"
    (prefix / "logs").mkdir(parents=True, exist_ok=True)
    conf = prefix / "nginx.conf"
    conf.write_text(
        f"""worker_processes 1;
error_log {prefix}/logs/error.log warn;
pid {prefix}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {prefix}/body; proxy_temp_path {prefix}/proxy;
  fastcgi_temp_path {prefix}/fcgi; uwsgi_temp_path {prefix}/uwsgi; scgi_temp_path {prefix}/scgi;
  upstream backend {{ server 127.0.0.1:{upstream}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_cache off;
      proxy_read_timeout 600s;
    }}
  }}
}}
"""
    )
    proc = subprocess.Popen([str(binary), "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"])
    try:
        _wait_port(port, proc, "nginx", "/health")
        yield port, proc.pid
    finally:
        stop_process(proc)


@contextmanager
def litellm_relay(upstream: int, model: str, work: Path) -> Iterator[tuple[int, int]]:
    """(port, pid) of the LiteLLM proxy serving ``model`` from ``127.0.0.1:upstream`` (module docstring)."""
    venv, port = ensure_peer("litellm-proxy"), _free_port()
    config = work / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {model}\n"
        "    litellm_params:\n"
        f"      model: openai/{model}\n"
        f"      api_base: http://127.0.0.1:{upstream}/v1\n"
        "      api_key: none\n"
        "litellm_settings:\n"
        "  drop_params: true\n"
    )
    log = open(work / "litellm.log", "wb")  # noqa: SIM115 - closed below
    command = [str(venv / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen([*command, "--num_workers", "1"], stdout=log, stderr=log)
    try:
        _wait_port(port, proc, "litellm", "/health/liveliness")
        yield port, proc.pid
    finally:
        stop_process(proc)
        log.close()
