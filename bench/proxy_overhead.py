"""Werk's ``/v1`` proxy overhead: the same chat request through Werk and straight to its llama-server.

One Werk host (in process, on waitress, configured like ``werk serve``; or ``--serve`` for a real
``werk serve`` subprocess) manages one llama-server on a generated model (or ``--model smollm2``,
the real SmolLM2-135M-Instruct of :func:`werk_host.realmodel.smollm2_gguf`). Each round sends the
same chat request (about ``--prompt-tokens`` prompt tokens, ``--max-tokens`` output tokens with
``ignore_eos``, temperature 0, fixed seed) to

* ``werk``   - ``POST {werk}/v1/chat/completions`` with the API key: auth, body bound, admission
               (fit bound or exact count, limits, reasoning), pooled relay;
* ``direct`` - ``POST {child}/v1/chat/completions`` on the managed llama-server itself;
* ``floor``  - a bare waitress WSGI app relaying the same request to the same child over a
               kept-alive ``http.client`` connection (no framework, auth or admission): the cost
               of any Python hop on this machine, so Werk's own share is ``werk - floor``;

in alternating order (ABBA), each over one persistent keep-alive connection per target, after a
warm-up. All land on the same child and the same cached slot, so the differences are the hops'.
Prints the medians, p90s, Werk's own share and the median ratio werk/direct (target <= 1.05).

``--vary`` puts a fresh nonce in every round's prompt (same length): no count cache or prompt
cache can serve it, as for a conversation that grows by one turn per request. Werk admits it on
its fit bound (no count round trip; ``werk_host.service.admission``). Target for Werk's own
share there: <= 1.5 ms.

``--stream`` sends ``"stream": true`` and times the first SSE byte (from sending the request to
the first body byte): Werk's relay must pass each event on as the child produces it. llama-server
closes a connection after a streamed answer (whatever its ``Keep-Alive`` header says), so the
``direct`` client opens a new one for each stream, inside the timing (closing the old one
outside it), as any direct client must; Werk's and the floor's clients keep theirs, and those
two open the new upstream connection themselves (Werk's relay connects a spare once a stream
ends, ``werk_host.backends.relay``). Werk sends its response headers as soon as llama-server's
arrive, before the first token (docs/operations.md, "Streaming"), as llama-server itself does;
the floor sends them with the first event.

    .venv/bin/python bench/proxy_overhead.py [--runs 60] [--warmup 10] [--vary] [--stream]
        [--model generated|smollm2] [--serve] [--dim 64 --layers 2] [--threads 1]
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
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from werk_llamacpp.binary import LlamaServerNotFound, find_llama_server  # noqa: E402
from werk_llamacpp.testing.testmodel import generate_model  # noqa: E402

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
    """One persistent keep-alive connection; ``post`` returns (ms, parsed JSON), ``stream`` returns
    (ms to the first body byte, ms to the end, the whole event stream)."""

    def __init__(self, port: int, path: str, headers: dict[str, str], *, fresh: bool = False) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.path = path
        self.headers = {"Content-Type": "application/json", **headers}
        #: llama-server closes a connection after a streamed answer, so its direct clients open a
        #: new one per stream (timed, as any client pays it); Werk's client keeps its connection
        #: and Werk opens the upstream one. Closed untimed here: no failed attempt on a dead socket.
        self.fresh = fresh

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

    def stream(self, body: bytes) -> tuple[float, float, bytes]:
        if self.fresh:
            self.conn.close()
        start = time.perf_counter()
        self.conn.request("POST", self.path, body=body, headers=self.headers)
        resp = self.conn.getresponse()
        first = resp.read1(65536)
        ttfb = (time.perf_counter() - start) * 1000.0
        rest = resp.read()
        total = (time.perf_counter() - start) * 1000.0
        if resp.status != 200 or not first:
            raise RuntimeError(f"{self.path} answered {resp.status}: {(first + rest)[:300]!r}")
        return ttfb, total, first + rest

    def get(self, path: str) -> dict[str, Any]:
        self.conn.request("GET", path, headers=self.headers)
        resp = self.conn.getresponse()
        data: dict[str, Any] = json.loads(resp.read())
        return data


@contextmanager
def werk_in_process(config: HostConfig) -> Iterator[tuple[int, int, str]]:
    """(werk port, child port, child API key) of an in-process host served like ``werk serve``."""
    host = build_host(config)
    with running(host) as base:
        proc = host.fleet.adapter.current()  # type: ignore[union-attr]
        assert proc is not None and proc.port is not None
        yield int(base.rsplit(":", 1)[1]), proc.port, proc.api_key


@contextmanager
def serve_werk(
    home: Path,
    server: Path | None,
    threads: int,
    extra: Sequence[str] = (),
    src: Path = ROOT,
    *,
    serving: Sequence[str] = ("--model", MODEL),
    env: dict[str, str] | None = None,
) -> Iterator[tuple[int, int, int]]:
    """(werk port, the pid of its default instance's backend process, werk's pid) of a ``werk
    serve`` subprocess run from the checkout ``src``: ``serving`` says what it serves (default
    ``--model bench``), ``server`` is the llama-server it runs with ``-t threads`` (``None``: no
    llama.cpp instance), ``extra`` adds more ``werk serve`` arguments, ``env`` more environment.
    The backend pid is 0 when the instance runs no local process (a remote endpoint)."""
    env = {**os.environ, "WERK_HOME": str(home), "WERK_API_KEYS": KEY, **(env or {})}
    if server is not None:  # a llama.cpp host: its llama-server and compute threads
        env["WERK_LLAMA_SERVER"] = str(server)
        env["WERK_LLAMA_ARGS"] = f"-t {threads}"
    env["PYTHONPATH"] = os.pathsep.join([str(src), *(str(p) for p in sorted(src.glob("plugins/*/src")))])
    log = open(home / "serve.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "werk_host", "serve", "--port", "0", *serving, *extra],
        stdout=subprocess.PIPE,
        stderr=log,
        env=env,
        text=True,
        cwd=src,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError((home / "serve.log").read_text()[-3000:])
        port = int(json.loads(line)["port"])
        obs = Target(port, "", {"Authorization": f"Bearer {KEY}"}).get("/werk/v1/observability")
        workers = [w for w in obs["data"]["workers"] if w.get("pid")]
        yield port, workers[0]["pid"] if workers else 0, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@contextmanager
def werk_serve(home: Path, server: Path, threads: int, extra: Sequence[str] = ()) -> Iterator[tuple[int, int, str]]:
    """(werk port, child port, child API key) of :func:`serve_werk`."""
    with serve_werk(home, server, threads, extra) as (port, pid, _):
        yield port, _listening_port(pid), _child_key(pid)


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


def _child_key(pid: int, variable: str = "LLAMA_API_KEY") -> str:
    """The per-process API key Werk gave its backend child in ``variable`` (from its environment,
    or its first descendant's that has it; Linux only): ``LLAMA_API_KEY`` for llama-server,
    ``VLLM_API_KEY`` for ``vllm serve``."""
    import psutil  # type: ignore[import-untyped]

    prefix = f"{variable}=".encode()
    for proc in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        with suppress(OSError):
            for entry in Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0"):
                if entry.startswith(prefix):
                    return entry.split(b"=", 1)[1].decode()
    return ""


@contextmanager
def floor_proxy(child_port: int, threads: int = 8) -> Iterator[int]:
    """A minimal waitress WSGI relay to the child (see the module docstring); yields its port.
    Streamed answers are relayed chunk by chunk as they arrive, like Werk's."""
    import threading

    from waitress.server import create_server  # type: ignore[import-untyped]

    local = threading.local()

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterator[bytes]:
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        headers = {"Content-Type": "application/json", "Authorization": environ.get("HTTP_AUTHORIZATION", "")}
        for _ in range(2):  # a thread's connection may have idled past llama-server's keep-alive
            conn = getattr(local, "conn", None)
            if conn is None:
                conn = local.conn = http.client.HTTPConnection("127.0.0.1", child_port, timeout=120)
            try:
                conn.request("POST", environ["PATH_INFO"], body=body, headers=headers)
                resp = conn.getresponse()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                conn.close()
                local.conn = None
        kind = resp.getheader("Content-Type", "application/json")
        if kind.startswith("text/event-stream"):
            start_response(f"{resp.status} {resp.reason}", [("Content-Type", kind)])
            local.conn = None  # llama-server closes a connection after a stream: next time, a new one
            return iter(lambda: resp.read1(16384), b"")
        data = resp.read()
        start_response(f"{resp.status} {resp.reason}", [("Content-Type", kind), ("Content-Length", str(len(data)))])
        return iter([data])

    server = create_server(app, host="127.0.0.1", port=0, threads=threads, channel_request_lookahead=1)
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


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=60, help="measured requests per target")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--prompt-tokens", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--model", choices=("generated", "smollm2"), default="generated")
    parser.add_argument("--dim", type=int, default=64, help="generated model width")
    parser.add_argument("--layers", type=int, default=2, help="generated model depth")
    parser.add_argument("--threads", type=int, default=1, help="llama-server compute threads")
    parser.add_argument("--vary", action="store_true", help="a fresh nonce in every prompt (no caches)")
    parser.add_argument("--stream", action="store_true", help="stream, and time the first SSE byte")
    parser.add_argument("--serve", action="store_true", help="measure a `werk serve` subprocess")
    args = parser.parse_args()

    server = llama_server()
    work = Path(tempfile.mkdtemp(prefix="werk-bench-proxy-"))
    if args.model == "smollm2":
        from werk_host.realmodel import smollm2_gguf

        model = smollm2_gguf()
        described = "SmolLM2-135M-Instruct Q4_1 (real)"
    else:
        model = generate_model(work / "bench.gguf", dim=args.dim, layers=args.layers)
        described = f"{args.dim}-dim {args.layers}-layer generated"
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
    with launcher as (werk_port, child_port, child_key), ExitStack() as stack:
        child_auth = {"Authorization": f"Bearer {child_key}"}
        floor_port = stack.enter_context(floor_proxy(child_port))
        targets = [
            ("werk", Target(werk_port, "/v1/chat/completions", {"Authorization": f"Bearer {KEY}"})),
            ("direct", Target(child_port, "/v1/chat/completions", child_auth, fresh=args.stream)),
            ("floor", Target(floor_port, "/v1/chat/completions", child_auth)),
        ]
        counter = Target(werk_port, "/werk/v1/chat/count_tokens", {"Authorization": f"Bearer {KEY}"})

        def count(text: str) -> int:
            _, data = counter.post(json.dumps({"messages": [{"role": "user", "content": text}]}).encode())
            return int(data["data"]["input_tokens"])

        nonce = "n" + secrets.token_hex(3)
        content = calibrate(count, args.prompt_tokens - (count(nonce) - count("")) if args.vary else args.prompt_tokens)

        def body() -> bytes:
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
                    "stream": args.stream,
                }
            ).encode()

        samples: dict[str, list[float]] = {name: [] for name, _ in targets}
        totals: dict[str, list[float]] = {name: [] for name, _ in targets}
        child_ms: dict[str, list[float]] = {name: [] for name, _ in targets}  # llama-server's own timings
        prompt_tokens = 0
        for round_no in range(args.warmup + args.runs):
            for name, target in targets if round_no % 2 == 0 else targets[::-1]:
                if args.stream:
                    first, total, events = target.stream(body())
                    assert events.rstrip().endswith(b"data: [DONE]"), events[-200:]
                    if round_no >= args.warmup:
                        samples[name].append(first)
                        totals[name].append(total)
                    continue
                elapsed, data = target.post(body())
                assert data["usage"]["completion_tokens"] == args.max_tokens, data["usage"]
                prompt_tokens = data["usage"]["prompt_tokens"]
                if round_no >= args.warmup:
                    samples[name].append(elapsed)
                    child_ms[name].append(data["timings"]["prompt_ms"] + data["timings"]["predicted_ms"])
        observed = Target(werk_port, "", {"Authorization": f"Bearer {KEY}"})  # ``counter`` may have idled out
        counters = observed.get("/werk/v1/observability")["data"]["chat"]

    med = {k: statistics.median(v) for k, v in samples.items()}
    ratio = med["werk"] / med["direct"]
    # the median of per-round ratios is less sensitive to drift on a shared machine
    paired = statistics.median(w / d for w, d in zip(samples["werk"], samples["direct"], strict=True))
    share = statistics.median(w - f for w, f in zip(samples["werk"], samples["floor"], strict=True))
    measured = "time to the first SSE byte" if args.stream else "round trip"
    print(
        f"commit {git_describe()} | {'werk serve subprocess' if args.serve else 'in-process host on waitress'} | "
        f"llama-server {server.parent.name} ({server}) -np 2 -c 4096 -t {args.threads}"
    )
    print(
        f"model {described} | prompt {prompt_tokens or '~' + str(args.prompt_tokens)} tokens "
        f"| max_tokens {args.max_tokens} (ignore_eos) | {'fresh prompt each round' if args.vary else 'same request'} "
        f"| {'streamed' if args.stream else 'non-streamed'} | {measured} | runs {args.runs} per target after "
        f"{args.warmup} warm-up (ABBA) | {platform.machine()} {os.cpu_count()} CPUs | load {os.getloadavg()[0]:.2f}"
    )
    for name in samples:
        if args.stream:
            extra = f"   (to the end: median {statistics.median(totals[name]):.3f} ms)"
        else:
            extra = f"   (llama-server's own prompt+predict median {statistics.median(child_ms[name]):.3f} ms)"
        print(
            f"  {name:<7} median {med[name]:8.3f} ms   p90 {percentile(samples[name], 0.9):8.3f} ms"
            f"   min {min(samples[name]):8.3f} ms{extra}"
        )
    print(f"  overhead median {med['werk'] - med['direct']:+.3f} ms   per-round ratio median {paired:.3f}")
    print(
        f"  bare waitress relay (floor): ratio {med['floor'] / med['direct']:.3f}, overhead "
        f"{med['floor'] - med['direct']:+.3f} ms"
    )
    print(f"  Werk's own share (werk - floor, per-round median) {share:+.3f} ms (target <= 1.5 ms)")
    print(f"  werk chat counters: {counters}")
    name = "werk/direct first SSE byte" if args.stream else "werk/direct"
    print(f"RATIO {name} (medians) = {ratio:.3f}  (target <= {TARGET})")
    strict = os.environ.get("WERK_BENCH_STRICT") == "1"
    return 1 if strict and ratio > TARGET else 0


def _serve_floor() -> None:
    """``python -m bench.proxy_overhead --floor-serve CHILD_PORT THREADS``: :func:`floor_proxy` in a
    process of its own (its port on stdout), until it is terminated."""
    with floor_proxy(int(sys.argv[2]), int(sys.argv[3])) as port:
        print(port, flush=True)
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--floor-serve"]:
        _serve_floor()
    sys.exit(main())
