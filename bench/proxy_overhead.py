"""Werk's ``/v1`` proxy overhead: the same chat request through Werk and straight to its llama-server.

One Werk host (in process, on waitress, configured like ``werk serve``; or ``--serve`` for a real
``werk serve`` subprocess) manages one llama-server on a generated model. Each round sends the
same non-streamed chat request (about ``--prompt-tokens`` prompt tokens, ``--max-tokens`` output
tokens with ``ignore_eos``, temperature 0, fixed seed) to

* ``werk``   - ``POST {werk}/v1/chat/completions`` with the API key: auth, body bound, admission
               (exact count through the adapter's cache, limits, reasoning), pooled relay;
* ``direct`` - ``POST {child}/v1/chat/completions`` on the managed llama-server itself,

in alternating order (ABBA), each over one persistent keep-alive connection per target, after a
warm-up. Both land on the same child and the same cached slot, so the difference is Werk's.
Prints the medians, p90s and the median ratio werk/direct (target <= 1.05).

``--floor`` adds a third target, ``floor``: a bare waitress WSGI app relaying the same request to
the same child over a kept-alive ``http.client`` connection (no framework, auth or admission): the
cost of any Python hop on this machine, so Werk's own share is ``werk - floor``.

``--vary`` puts a fresh nonce in every round's prompt (same length): no count cache or prompt
cache can serve it, so Werk's exact admission count (``/apply-template`` + ``/tokenize`` on the
child) is paid every time, as for a conversation that grows by one turn per request.

    .venv/bin/python bench/proxy_overhead.py [--runs 60] [--warmup 10] [--vary] [--serve] [--floor]
        [--dim 64 --layers 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from werk_llamacpp.binary import LlamaServerNotFound, find_llama_server  # noqa: E402
from werk_llamacpp.testmodel import generate_model  # noqa: E402

from werk_host.config import HostConfig  # noqa: E402
from werk_host.models import ModelManifest, ModelRegistry  # noqa: E402
from werk_host.server import build_host  # noqa: E402
from werk_host.testing.hosts import running  # noqa: E402

KEY = "sk-werk-bench-proxy-overhead"
MODEL = "bench"
TARGET = 1.05


def llama_server() -> Path:
    """The cached/configured llama-server, building it once with the project script if needed."""
    try:
        return find_llama_server()
    except LlamaServerNotFound:
        print("llama-server not found: building it with scripts/build-llama-server.sh", file=sys.stderr)
        built = subprocess.run(
            ["bash", str(ROOT / "scripts" / "build-llama-server.sh")], check=True, capture_output=True, text=True
        )
        return Path(built.stdout.strip().splitlines()[-1])


def git_describe() -> str:
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain"], capture_output=True, text=True)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except OSError:
        return "unknown"


class Target:
    """One persistent keep-alive connection; ``post`` returns (ms, parsed JSON)."""

    def __init__(self, port: int, path: str, headers: dict[str, str]) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.path = path
        self.headers = {"Content-Type": "application/json", **headers}

    def post(self, body: bytes) -> tuple[float, dict[str, Any]]:
        start = time.perf_counter()
        self.conn.request("POST", self.path, body=body, headers=self.headers)
        resp = self.conn.getresponse()
        raw = resp.read()
        elapsed = (time.perf_counter() - start) * 1000.0
        if resp.status != 200:
            raise RuntimeError(f"{self.path} answered {resp.status}: {raw[:300]!r}")
        data: dict[str, Any] = json.loads(raw)
        return elapsed, data

    def get(self, path: str) -> dict[str, Any]:
        self.conn.request("GET", path, headers=self.headers)
        resp = self.conn.getresponse()
        data: dict[str, Any] = json.loads(resp.read())
        return data


@contextmanager
def werk_in_process(config: HostConfig) -> Iterator[tuple[int, int]]:
    """(werk port, child port) of an in-process host served like ``werk serve``."""
    host = build_host(config)
    with running(host) as base:
        proc = host.runtime.adapter.current()  # type: ignore[union-attr]
        assert proc is not None and proc.port is not None
        yield int(base.rsplit(":", 1)[1]), proc.port


@contextmanager
def werk_serve(home: Path, server: Path, threads: int) -> Iterator[tuple[int, int]]:
    """(werk port, child port) of a ``werk serve`` subprocess."""
    env = {**os.environ, "WERK_HOME": str(home), "WERK_API_KEYS": KEY, "WERK_LLAMA_SERVER": str(server)}
    env["WERK_LLAMA_ARGS"] = f"-t {threads}"
    log = open(home / "serve.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "werk_host", "serve", "--port", "0", "--model", MODEL],
        stdout=subprocess.PIPE,
        stderr=log,
        env=env,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError((home / "serve.log").read_text()[-3000:])
        port = int(json.loads(line)["port"])
        obs = Target(port, "", {"Authorization": f"Bearer {KEY}"}).get("/werk/v1/observability")
        pid = obs["data"]["workers"][0]["pid"]
        child = _listening_port(pid)
        yield port, child
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def _listening_port(pid: int) -> int:
    """The TCP port the child ``pid`` listens on (from /proc; Linux only)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd)
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
            return int(fields[1].split(":")[1], 16)
    raise RuntimeError(f"no listening socket for pid {pid}")


@contextmanager
def floor_proxy(child_port: int) -> Iterator[int]:
    """A minimal waitress WSGI relay to the child (see ``--floor``); yields its port."""
    import threading

    from waitress.server import create_server  # type: ignore[import-untyped]

    local = threading.local()

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        for _ in range(2):  # a thread's connection may have idled past llama-server's keep-alive
            conn = getattr(local, "conn", None)
            if conn is None:
                conn = local.conn = http.client.HTTPConnection("127.0.0.1", child_port, timeout=120)
            try:
                conn.request("POST", environ["PATH_INFO"], body=body, headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                conn.close()
                local.conn = None
        data = resp.read()
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
        start_response(f"{resp.status} {resp.reason}", headers)
        return [data]

    server = create_server(app, host="127.0.0.1", port=0, threads=8, channel_request_lookahead=1)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        server.close()


def calibrate(count: Callable[[str], int], tokens: int) -> str:
    """A user message of about ``tokens`` rendered prompt tokens."""
    words = ["werk", "keeps", "the", "prompt", "cache", "warm", "for", "every", "model", "state"]
    text = ""
    for i in range(4 * tokens):
        candidate = (text + " " + words[i % len(words)]).strip()
        if count(candidate) > tokens:
            break
        text = candidate
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=60, help="measured requests per target")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--prompt-tokens", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="llama-server compute threads")
    parser.add_argument("--vary", action="store_true", help="a fresh nonce in every prompt (no caches)")
    parser.add_argument("--serve", action="store_true", help="measure a `werk serve` subprocess")
    parser.add_argument("--floor", action="store_true", help="also measure a bare waitress relay")
    args = parser.parse_args()

    server = llama_server()
    work = Path(tempfile.mkdtemp(prefix="werk-bench-proxy-"))
    model = generate_model(work / "bench.gguf", dim=args.dim, layers=args.layers)
    home = work / "home"
    home.mkdir()
    ModelRegistry(home).add(ModelManifest.from_paths(MODEL, [model], backend="llama.cpp"))
    config = HostConfig(
        home=home,
        api_keys=(KEY,),
        model=MODEL,
        backend_options={
            "llamacpp": {"llama_server": str(server), "parallel": 2, "ctx": 4096, "threads": args.threads}
        },
    )
    launcher = werk_serve(home, server, args.threads) if args.serve else werk_in_process(config)
    with launcher as (werk_port, child_port), ExitStack() as stack:
        werk = Target(werk_port, "/v1/chat/completions", {"Authorization": f"Bearer {KEY}"})
        direct = Target(child_port, "/v1/chat/completions", {})
        targets = [("werk", werk), ("direct", direct)]
        if args.floor:
            targets.append(("floor", Target(stack.enter_context(floor_proxy(child_port)), "/v1/chat/completions", {})))
        counter = Target(werk_port, "/werk/v1/chat/count_tokens", {"Authorization": f"Bearer {KEY}"})

        def count(text: str) -> int:
            _, data = counter.post(json.dumps({"messages": [{"role": "user", "content": text}]}).encode())
            return int(data["data"]["input_tokens"])

        nonce = "n" + secrets.token_hex(3)
        content = calibrate(count, args.prompt_tokens - (count(nonce) - count("")) if args.vary else args.prompt_tokens)

        def body(round_no: int) -> bytes:
            text = f"{secrets.token_hex(3)} {content}" if args.vary else content
            return json.dumps(
                {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": text}],
                    "max_tokens": args.max_tokens,
                    "temperature": 0,
                    "seed": 42,
                    "ignore_eos": True,
                    "cache_prompt": True,  # what Werk adds upstream; llama-server's default anyway
                }
            ).encode()

        samples: dict[str, list[float]] = {name: [] for name, _ in targets}
        child_ms: dict[str, list[float]] = {name: [] for name, _ in targets}  # llama-server's own timings
        usage: dict[str, Any] = {}
        for round_no in range(args.warmup + args.runs):
            for name, target in targets if round_no % 2 == 0 else targets[::-1]:
                elapsed, data = target.post(body(round_no))
                assert data["usage"]["completion_tokens"] == args.max_tokens, data["usage"]
                usage[name] = data["usage"]
                if round_no >= args.warmup:
                    samples[name].append(elapsed)
                    child_ms[name].append(data["timings"]["prompt_ms"] + data["timings"]["predicted_ms"])
        counters = counter.get("/werk/v1/observability")["data"]["chat"]

    med = {k: statistics.median(v) for k, v in samples.items()}
    p90 = {k: statistics.quantiles(v, n=10)[-1] for k, v in samples.items()}
    ratio = med["werk"] / med["direct"]
    # the median of per-round ratios is less sensitive to drift on a shared machine
    paired = statistics.median(w / d for w, d in zip(samples["werk"], samples["direct"], strict=True))
    print(
        f"commit {git_describe()} | {'werk serve subprocess' if args.serve else 'in-process host on waitress'} | "
        f"llama-server {server.parent.name} ({server}) -np 2 -c 4096 -t {args.threads}"
    )
    print(
        f"model {args.dim}-dim {args.layers}-layer generated | prompt {usage['werk']['prompt_tokens']} tokens "
        f"| max_tokens {args.max_tokens} (ignore_eos) | {'fresh prompt each round' if args.vary else 'same request'} "
        f"| runs {args.runs} per target after {args.warmup} warm-up | {platform.machine()} {os.cpu_count()} CPUs"
    )
    for name in samples:
        print(
            f"  {name:<7} median {med[name]:8.3f} ms   p90 {p90[name]:8.3f} ms   min {min(samples[name]):8.3f} ms"
            f"   (llama-server's own prompt+predict time: median {statistics.median(child_ms[name]):.3f} ms)"
        )
    print(f"  overhead median {med['werk'] - med['direct']:+.3f} ms   per-round ratio median {paired:.3f}")
    if "floor" in med:
        print(
            f"  bare waitress relay: ratio {med['floor'] / med['direct']:.3f}, overhead "
            f"{med['floor'] - med['direct']:+.3f} ms; Werk's own share {med['werk'] - med['floor']:+.3f} ms"
        )
    print(f"  werk chat counters: {counters}")
    print(f"RATIO werk/direct (medians) = {ratio:.3f}  (target <= {TARGET})")
    strict = os.environ.get("WERK_BENCH_STRICT") == "1"
    return 1 if strict and ratio > TARGET else 0


if __name__ == "__main__":
    sys.exit(main())
