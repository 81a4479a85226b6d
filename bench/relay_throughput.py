"""Streamed relay throughput: tokens/s and TTFT straight to llama-server vs through ``werk serve``.

One ``werk serve`` subprocess (``--model`` on a generated tiny GGUF, or ``--model smollm2``)
manages one llama-server; beside it runs a bare llama-server with ``--parallel 4`` and Werk's
child's own command line otherwise (its own port, no API key, no slot save path). Werk's child
runs with ``--parallel 5``: Werk keeps the last slot for its states (prefill, decode; the
llama.cpp plugin's ``ordinary_capacity``), so both serve chats on 4 slots of 1,024 tokens, and
the difference is the relay's. The bench sends the same streamed chat request
(``--max-tokens`` output tokens, 32 by default, with ``ignore_eos``, temperature 0, fixed seed)
at n = 1, 4, 16 and 64 concurrent streams to

* ``direct``    - ``POST {bare}/v1/chat/completions`` on the bare llama-server;
* ``werk``      - ``POST {werk}/v1/chat/completions``: auth, admission, gate, pooled relay;
* ``floor``     - the least relay this stack allows, in a process of its own: a bare waitress
                  WSGI app (``bench.proxy_overhead.floor_proxy``; no framework, auth, admission,
                  gate or accounting) with Werk's thread count, passing each request to the bare
                  llama-server over ``http.client`` and its events back as they arrive. The
                  ``RATIO`` lines print its figure beside the target: what any Python relay on
                  waitress costs on this machine;
* ``anthropic`` - ``POST {werk}/v1/messages`` (the Anthropic translator; n = 4 and 16);
* ``ollama``    - ``POST {werk}/api/chat`` (the Ollama translator; n = 4 and 16);
* ``base``      - with ``--baseline DIR``: ``/v1/chat/completions`` on a second ``werk serve``
                  run from the checkout ``DIR`` (e.g. ``git worktree add /tmp/base HEAD~3``)
                  with its own llama-server, for a before/after A/B in one run.

Each measurement runs n client streams at once, each sending requests back to back (``--per``
requests per stream; at least 2), over fresh connections with ``Connection: close`` (llama-server
closes after every stream anyway), from one single-threaded ``selectors`` client that neither
parses JSON nor decodes chunks, so the client costs the same whatever it talks to. Tokens/s is
the completion tokens the answers report (their final usage) over the measurement's wall time;
TTFT is the time from connecting to the first byte of the first token event; an answer ends at
its last byte (the end of its chunked body), not at the server's close. The ``werk CPU`` column
is the serving ``werk serve`` process's CPU time over the measurement (its threads' run time
from ``/proc``) per relayed token: less noisy than tokens/s on a shared machine. The targets run
in alternating order (ABBA), ``--reps`` times per n; the table shows medians, the ratio is the
median of the per-repetition ratios (less sensitive to drift on a shared machine).

``--engine vllm`` measures the same in front of ``vllm serve`` on CPU (``WERK_VLLM``, else
``scripts/setup-vllm.sh``; a generated tiny Hugging Face Llama, ``--max-model-len 1024``,
``--gpu-memory-utilization 0.1`` of this host's memory, vLLM's defaults otherwise). One engine
serves every target, one after the other:

* ``direct``    - the ``vllm serve`` process itself, with the API key Werk gave it;
* ``werk``      - the ``werk serve`` that manages it (a managed instance);
* ``remote``    - a second ``werk serve`` whose profile has it as a remote instance
                  (``endpoint``, ``api_key_env``; docs/deployments.md, "Remote instances");
* ``anthropic``, ``ollama`` - the translators on the managing ``werk serve``;
* ``floor``     - the bare waitress relay (as above) in front of that ``vllm serve``, the
                  client's key passed through.

Its ``RATIO`` lines carry a ``vllm_`` prefix.

Werk runs with ``--threads 96 --inference-max 80 --inference-per-key 80 --inference-queue 80``
(override with ``--werk-args``): the default 32 threads admit 24 generation requests and one
key 12, so 64 concurrent streams of one key would be refused, not relayed.

Ends with ``RATIO`` lines: ``relay_tokens_per_s_n{1,4,16,64}`` (target >= 0.95),
``anthropic_relay_tokens_per_s_n{4,16}`` and ``ollama_relay_tokens_per_s_n{4,16}`` (>= 0.9),
``relay_added_ttft_p50_ms_n{1,4,16,64}`` (target <= 1 ms at n <= 4, <= 5 ms at n = 16).
``relay_cpu_us_per_token_n{1,4,16,64}``: Werk's CPU µs per relayed token (target <= 0.35 x the
floor's figure at every n, <= 20 at n = 64), with nginx's and LiteLLM's figures beside it;
``relay_cpu_vs_litellm_n*`` (target <= 0.1) and ``nginx_relay_tokens_per_s_n*``. The peers
(llama.cpp only; ``--no-peers`` leaves them out) are nginx from Debian as an SSE reverse proxy
and the LiteLLM proxy, both on the bare llama-server (bench/_relay_peers.py).

    .venv/bin/python bench/relay_throughput.py [--reps 3] [--per 64] [--max-tokens 32]
        [--engine llamacpp|vllm] [--model generated|smollm2] [--threads 1] [--baseline DIR]
        [--ns 1,4,16,64] [--compat-ns 4,16]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import selectors
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from werk_llamacpp.testing.testmodel import generate_model  # noqa: E402

from bench._relay_peers import litellm_relay, nginx_relay, tree_cpu_s  # noqa: E402
from bench.proxy_overhead import (  # noqa: E402
    KEY,
    MODEL,
    Target,
    _child_key,
    git_describe,
    llama_server,
    percentile,
    serve_werk,
)
from werk_host.models import ModelManifest, ModelRegistry  # noqa: E402

#: llama-server's slots (and Werk's ordinary slots), and each slot's context.
PARALLEL, SLOT_CTX = 4, 1024
WERK_ARGS = "--threads 96 --inference-max 80 --inference-per-key 80 --inference-queue 80"
PROMPT = "werk keeps the prompt cache warm for every model state"
#: The first byte of a token event, per protocol (a non-empty text piece).
FIRST_TOKEN = {
    "openai": re.compile(rb'"content":\s*"[^"]'),
    "anthropic": re.compile(rb'"text_delta"'),
    "ollama": re.compile(rb'"content":\s*"[^"]'),
}
#: The output tokens an answer reports (the last match in its tail).
OUTPUT_TOKENS = {
    "openai": re.compile(rb'"completion_tokens":\s*(\d+)'),
    "anthropic": re.compile(rb'"output_tokens":\s*(\d+)'),
    "ollama": re.compile(rb'"eval_count":\s*(\d+)'),
}
TAIL = 4096


@dataclass(frozen=True)
class Kind:
    """One target: its port, path, protocol and request body."""

    name: str
    port: int
    path: str
    protocol: str
    headers: dict[str, str]
    body: bytes

    def request(self) -> bytes:
        head = [f"POST {self.path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
        head += [f"{k}: {v}" for k, v in self.headers.items()]
        head += [f"Content-Length: {len(self.body)}", "Connection: close", "", ""]
        return "\r\n".join(head).encode() + self.body


@dataclass
class _Stream:
    sock: socket.socket
    started: float
    head: bytearray = field(default_factory=bytearray)
    tail: bytes = b""
    first: float | None = None


@dataclass
class Run:
    elapsed: float
    tokens: int
    ttft_ms: list[float]
    failures: list[str]
    cpu_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed


def run_load(kind: Kind, n: int, per: int) -> Run:
    """``n`` concurrent streams, ``per`` requests each back to back (module docstring)."""
    request = kind.request()
    first_token, output = FIRST_TOKEN[kind.protocol], OUTPUT_TOKENS[kind.protocol]
    sel = selectors.DefaultSelector()
    left = n * per
    tokens, ttfts, failures = 0, [], []

    def start() -> None:
        nonlocal left
        left -= 1
        started = time.perf_counter()
        sock = socket.create_connection(("127.0.0.1", kind.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(request)
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ, _Stream(sock, started))

    began = time.perf_counter()
    for _ in range(n):
        start()
    while sel.get_map():
        for key, _ in sel.select():
            stream: _Stream = key.data
            try:
                data = stream.sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError as err:
                data, failure = b"", f"{type(err).__name__}"
                failures.append(failure)
            if data:
                if stream.first is None:
                    stream.head += data
                    if first_token.search(stream.head):
                        stream.first = time.perf_counter()
                        ttfts.append((stream.first - stream.started) * 1000.0)
                stream.tail = (stream.tail + data)[-TAIL:]
                if not stream.tail.endswith(b"\r\n0\r\n\r\n"):
                    continue  # not yet the end of the chunked body
            sel.unregister(stream.sock)
            stream.sock.close()
            whole = bytes(stream.head[:64]) if stream.head else stream.tail[:64]
            counts = output.findall(stream.tail)
            if not whole.startswith(b"HTTP/1.1 200") or not counts:
                failures.append((bytes(stream.head[:300]) or stream.tail[-300:]).decode("latin-1"))
            else:
                tokens += int(counts[-1])
            if left > 0:
                start()
    return Run(time.perf_counter() - began, tokens, ttfts, failures)


def cpu_s(pid: int) -> float:
    """CPU seconds the threads of process ``pid`` have run so far (Linux ``/proc/*/schedstat``,
    nanoseconds; a thread that has exited meanwhile drops out, and waitress's threads live on)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with suppress(OSError, ValueError, IndexError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


@contextmanager
def bare_llama_server(child_pid: int, log_path: Path) -> Iterator[int]:
    """The port of a llama-server started with Werk's child's own command line (Linux
    ``/proc``), but ``-np PARALLEL -c PARALLEL*SLOT_CTX``, its own port, no slot save path and no
    API key: the server a user would run by hand (module docstring)."""
    argv = Path(f"/proc/{child_pid}/cmdline").read_bytes().split(b"\0")[:-1]
    replaced = {b"--port": b"0", b"-np": str(PARALLEL).encode(), b"-c": str(PARALLEL * SLOT_CTX).encode()}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    replaced[b"--port"] = str(port).encode()
    cmd: list[bytes] = [argv[0]]
    i = 1
    while i < len(argv):
        flag = argv[i]
        if flag == b"--slot-save-path":
            i += 2
            continue
        cmd.append(flag)
        if flag in replaced and i + 1 < len(argv):
            cmd.append(replaced[flag])
            i += 2
            continue
        i += 1
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_API_KEY"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"bare llama-server did not start: {log_path.read_text()[-2000:]}")
            try:
                conn = Target(port, "", {})
                conn.conn.request("GET", "/health")
                if conn.conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def bodies(max_tokens: int) -> dict[str, bytes]:
    messages = [{"role": "user", "content": PROMPT}]
    common = {"model": MODEL, "messages": messages, "stream": True}
    openai = {
        **common,
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 42,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    anthropic = {**common, "max_tokens": max_tokens, "temperature": 0}
    ollama = {**common, "options": {"num_predict": max_tokens, "temperature": 0, "seed": 42}}
    return {k: json.dumps(v).encode() for k, v in (("openai", openai), ("anthropic", anthropic), ("ollama", ollama))}


@contextmanager
def floor_relay(port: int, werk_args: str) -> Iterator[tuple[int, int]]:
    """(port, pid) of the least relay this stack allows, in a process of its own: a bare waitress
    WSGI app (``bench.proxy_overhead.floor_proxy``: no framework, auth, admission, gate or
    accounting) passing each request to the bare llama-server at ``port`` and its stream back
    as it arrives, with as many threads as Werk's ``--threads`` (module docstring)."""
    words = shlex.split(werk_args)
    threads = words[words.index("--threads") + 1] if "--threads" in words else "32"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.proxy_overhead", "--floor-serve", str(port), threads],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline()), proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@dataclass
class Setup:
    """The targets of one run, the process whose CPU each is measured on, and how it reads."""

    kinds: dict[str, Kind]
    pids: dict[str, int]
    described: str
    #: targets whose CPU is their process's and its children's (nginx's workers)
    trees: set[str] = field(default_factory=set)


def llamacpp_setup(stack: ExitStack, work: Path, args: argparse.Namespace, body: dict[str, bytes]) -> Setup:
    """``werk serve`` on llama.cpp (a generated GGUF or SmolLM2) beside a bare llama-server with
    its child's command line (module docstring)."""
    server = llama_server()
    if args.model == "smollm2":
        from werk_host.realmodel import smollm2_gguf

        model, described = smollm2_gguf(), "SmolLM2-135M-Instruct Q4_1 (real)"
    else:
        model, described = generate_model(work / "bench.gguf", dim=64, layers=2), "64-dim 2-layer generated"
    # 4 ordinary slots and Werk's state slot, 1,024 tokens each (module docstring)
    extra = [*shlex.split(args.werk_args), "--backend-option", f"llamacpp.parallel={PARALLEL + 1}"]
    extra += ["--backend-option", f"llamacpp.ctx={(PARALLEL + 1) * SLOT_CTX}"]
    auth = {"Authorization": f"Bearer {KEY}"}
    homes = {}
    for name in ("werk", "base") if args.baseline else ("werk",):
        home = work / f"home-{name}"
        home.mkdir()
        ModelRegistry(home).add(ModelManifest.from_paths(MODEL, [model], backend="llama.cpp"))
        homes[name] = home
    werk_port, child_pid, werk_pid = stack.enter_context(serve_werk(homes["werk"], server, args.threads, extra))
    direct_port = stack.enter_context(bare_llama_server(child_pid, work / "direct.log"))
    kinds = {
        "direct": Kind("direct", direct_port, "/v1/chat/completions", "openai", {}, body["openai"]),
        "werk": Kind("werk", werk_port, "/v1/chat/completions", "openai", auth, body["openai"]),
        "anthropic": Kind("anthropic", werk_port, "/v1/messages", "anthropic", auth, body["anthropic"]),
        "ollama": Kind("ollama", werk_port, "/api/chat", "ollama", auth, body["ollama"]),
    }
    pids = {name: werk_pid for name in kinds}
    floor_port, pids["floor"] = stack.enter_context(floor_relay(direct_port, args.werk_args))
    kinds["floor"] = Kind("floor", floor_port, "/v1/chat/completions", "openai", {}, body["openai"])
    trees = set()
    if args.peers:  # bench/_relay_peers.py
        nginx_port, pids["nginx"] = stack.enter_context(nginx_relay(direct_port, work))
        kinds["nginx"] = Kind("nginx", nginx_port, "/v1/chat/completions", "openai", {}, body["openai"])
        litellm_port, pids["litellm"] = stack.enter_context(litellm_relay(direct_port, MODEL, work))
        kinds["litellm"] = Kind("litellm", litellm_port, "/v1/chat/completions", "openai", {}, body["openai"])
        trees = {"nginx", "litellm"}
    if args.baseline:
        base_port, _, base_pid = stack.enter_context(
            serve_werk(homes["base"], server, args.threads, extra, src=args.baseline.resolve())
        )
        kinds["base"] = Kind("base", base_port, "/v1/chat/completions", "openai", auth, body["openai"])
        pids["base"] = base_pid
    header = (
        f"llama-server {server} -np {PARALLEL} -c {PARALLEL * SLOT_CTX} (werk's: -np {PARALLEL + 1}) "
        f"-t {args.threads} | model {described}"
    )
    return Setup(kinds, pids, header, trees)


def _served_port(pid: int) -> int:
    """The ``--port`` of the ``vllm serve`` command line of ``pid`` or a process it started (its
    engine's processes listen on ports of their own)."""
    import psutil  # type: ignore[import-untyped]

    for proc in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        argv = proc.cmdline()
        if "serve" in argv and "--port" in argv:
            return int(argv[argv.index("--port") + 1])
    raise RuntimeError(f"no vllm serve --port under pid {pid}")


def vllm_setup(stack: ExitStack, work: Path, args: argparse.Namespace, body: dict[str, bytes]) -> Setup:
    """``vllm serve`` (CPU) on a generated tiny Hugging Face Llama, managed by one ``werk serve``
    (``werk``) and, as a remote instance, fronted by a second (``remote``); ``direct`` is that same
    ``vllm serve`` process, with the key Werk gave it (module docstring)."""
    from werk_vllm.testing import testmodel

    from bench.vllm_proxy_overhead import vllm_executable

    executable = vllm_executable()
    model_dir = work / "tiny-hf"
    subprocess.run(
        [str(executable.parent / "python"), testmodel.__file__, str(model_dir)], check=True, stdout=subprocess.DEVNULL
    )
    home = work / "home-werk"
    home.mkdir()
    files = sorted(p for p in model_dir.iterdir() if p.is_file())
    ModelRegistry(home).add(ModelManifest.from_paths(MODEL, files, backend="vllm"))
    extra = [*shlex.split(args.werk_args), "--backend-option", f"vllm.max_model_len={SLOT_CTX}"]
    extra += ["--backend-option", "vllm.gpu_memory_utilization=0.1"]  # of this host's memory on CPU
    env = {"WERK_VLLM": str(executable)}
    werk_port, _, werk_pid = stack.enter_context(serve_werk(home, None, 1, extra, env=env))
    # the instance starts on its first use: one answer, then its process
    auth = {"Authorization": f"Bearer {KEY}"}
    plain = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2})
    Target(werk_port, "/v1/chat/completions", auth).post(plain.encode())
    workers = Target(werk_port, "", auth).get("/werk/v1/observability")["data"]["workers"]
    child_pid = int(workers[0]["pid"])
    child_port, key = _served_port(child_pid), _child_key(child_pid, "VLLM_API_KEY")
    remote_home = work / "home-remote"
    remote_home.mkdir()
    profile = remote_home / "remote.toml"
    profile.write_text(
        f'[[instance]]\nid = "remote"\nmodel = "{MODEL}"\nbackend = "vllm"\n'
        f'endpoint = "http://127.0.0.1:{child_port}"\napi_key_env = "BENCH_VLLM_KEY"\n'
        "preload = true\n"
    )
    remote_port, _, remote_pid = stack.enter_context(
        serve_werk(remote_home, None, 1, extra, serving=("--profile", str(profile)), env={"BENCH_VLLM_KEY": key})
    )
    kinds = {
        "direct": Kind(
            "direct", child_port, "/v1/chat/completions", "openai", {"Authorization": f"Bearer {key}"}, body["openai"]
        ),
        "werk": Kind("werk", werk_port, "/v1/chat/completions", "openai", auth, body["openai"]),
        "remote": Kind("remote", remote_port, "/v1/chat/completions", "openai", auth, body["openai"]),
        "anthropic": Kind("anthropic", werk_port, "/v1/messages", "anthropic", auth, body["anthropic"]),
        "ollama": Kind("ollama", werk_port, "/api/chat", "ollama", auth, body["ollama"]),
    }
    pids = {name: werk_pid for name in kinds} | {"remote": remote_pid}
    floor_port, pids["floor"] = stack.enter_context(floor_relay(child_port, args.werk_args))
    kinds["floor"] = Kind(
        "floor", floor_port, "/v1/chat/completions", "openai", kinds["direct"].headers, body["openai"]
    )
    header = (
        f"vllm serve (CPU) {executable} --max-model-len {SLOT_CTX} --gpu-memory-utilization 0.1 "
        "| model tiny generated Llama (HF)"
    )
    return Setup(kinds, pids, header)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3, help="measurements per target and n")
    parser.add_argument("--per", type=int, default=64, help="requests per stream at n=1 (per/n at n, at least 2)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--ns", default="1,4,16,64", help="concurrent streams, comma-separated")
    parser.add_argument("--compat-ns", default="4,16", help="n at which the translators are measured")
    parser.add_argument("--engine", choices=("llamacpp", "vllm"), default="llamacpp")
    parser.add_argument("--model", choices=("generated", "smollm2"), default="generated", help="llama.cpp's model")
    parser.add_argument("--threads", type=int, default=1, help="llama-server compute threads")
    parser.add_argument("--werk-args", default=WERK_ARGS, help="extra `werk serve` arguments")
    parser.add_argument("--baseline", type=Path, help="a second checkout to measure as `base` (llama.cpp)")
    parser.add_argument("--no-peers", dest="peers", action="store_false", help="without nginx and LiteLLM (llama.cpp)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="werk-bench-relay-"))
    ns = [int(x) for x in args.ns.split(",")]
    compat_ns = {int(x) for x in args.compat_ns.split(",") if x}
    body = bodies(args.max_tokens)
    with ExitStack() as stack:
        setup = (vllm_setup if args.engine == "vllm" else llamacpp_setup)(stack, work, args, body)
        kinds = setup.kinds
        for kind in kinds.values():  # warm-up: connections, slots, the fit bound's evidence
            run_load(kind, 4, 2)
        runs: dict[tuple[str, int], list[Run]] = {}
        for n in ns:
            per = max(2, args.per // n)
            names = [k for k in kinds if k not in ("anthropic", "ollama") or n in compat_ns]
            for rep in range(args.reps):
                for name in names if rep % 2 == 0 else names[::-1]:
                    pid = setup.pids.get(name, 0)
                    clock = tree_cpu_s if name in setup.trees else cpu_s
                    before = clock(pid) if pid else 0.0
                    run = run_load(kinds[name], n, per)
                    run.cpu_s = clock(pid) - before if pid else 0.0
                    if run.failures:
                        print(f"  {name} n={n}: {len(run.failures)} failed: {run.failures[0][:300]!r}", file=sys.stderr)
                    runs.setdefault((name, n), []).append(run)
        load = os.getloadavg()[0]

    def tps(name: str, n: int) -> float:
        return statistics.median(r.tokens_per_s for r in runs[(name, n)])

    def ttft(name: str, n: int) -> float:
        return statistics.median(t for r in runs[(name, n)] for t in r.ttft_ms)

    def ttft90(name: str, n: int) -> float:
        return percentile([t for r in runs[(name, n)] for t in r.ttft_ms], 0.9)

    def cpu(name: str, n: int) -> float:
        return statistics.median(1e6 * r.cpu_s / max(r.tokens, 1) for r in runs[(name, n)])

    def ratio(name: str, n: int) -> float:
        pairs = zip(runs[(name, n)], runs[("direct", n)], strict=True)
        return statistics.median(a.tokens_per_s / b.tokens_per_s for a, b in pairs)

    print(
        f"commit {git_describe()} | werk serve {args.werk_args} | {setup.described} | "
        f"{args.max_tokens}-token streamed answers | {args.reps} reps "
        f"(ABBA) | {platform.machine()} {os.cpu_count()} CPUs | load {load:.2f}"
    )
    print("| streams | target | tokens/s | ratio to direct | TTFT p50 (p90) ms | werk CPU µs/token | tokens/answer |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for n in ns:
        for name in kinds:
            if (name, n) not in runs:
                continue
            got = runs[(name, n)]
            answers = sum(len(r.ttft_ms) for r in got) or 1
            per_answer = sum(r.tokens for r in got) / answers
            shown = "-" if name == "direct" else f"{ratio(name, n):.3f}"
            print(
                f"| {n} | {name} | {tps(name, n):,.0f} | {shown} | {ttft(name, n):.2f} ({ttft90(name, n):.2f}) "
                f"| {cpu(name, n):.1f} | {per_answer:.1f} |"
            )
    prefix = "vllm_" if args.engine == "vllm" else ""
    for n in ns:
        floor = f", floor {ratio('floor', n):.3f}" if ("floor", n) in runs else ""
        print(f"RATIO {prefix}relay_tokens_per_s_n{n} = {ratio('werk', n):.3f} (target >= 0.95{floor})")
        if ("remote", n) in runs:
            print(f"RATIO {prefix}remote_relay_tokens_per_s_n{n} = {ratio('remote', n):.3f} (target >= 0.95{floor})")
    for name in ("anthropic", "ollama"):
        for n in sorted(compat_ns):
            if (name, n) in runs:
                print(f"RATIO {prefix}{name}_relay_tokens_per_s_n{n} = {ratio(name, n):.3f} (target >= 0.9)")
    for n in ns:
        target = " (target <= 1 ms)" if n <= 4 else " (target <= 5 ms)" if n <= 16 else ""
        if ("floor", n) in runs:
            target = target[:-1] + f", floor {ttft('floor', n) - ttft('direct', n):+.2f} ms)" if target else ""
        print(f"RATIO {prefix}relay_added_ttft_p50_ms_n{n} = {ttft('werk', n) - ttft('direct', n):+.2f}{target}")
    for n in ns:  # CPU per relayed token (docs/operations.md, "Where relay time goes")
        if ("floor", n) not in runs:
            continue
        werk, floor = cpu("werk", n), cpu("floor", n)
        target = f"target <= {0.35 * floor:.1f} = 0.35 x floor {floor:.1f}" + (" and <= 20" if n == 64 else "")
        peers = "".join(f", {p} {cpu(p, n):.1f}" for p in ("nginx", "litellm") if (p, n) in runs)
        print(f"RATIO {prefix}relay_cpu_us_per_token_n{n} = {werk:.1f} ({target}{peers})")
        if ("litellm", n) in runs:
            print(f"RATIO {prefix}relay_cpu_vs_litellm_n{n} = {werk / cpu('litellm', n):.3f} (target <= 0.1)")
        if ("nginx", n) in runs:
            print(f"RATIO {prefix}nginx_relay_tokens_per_s_n{n} = {ratio('nginx', n):.3f} (compiled reference)")
    if args.baseline:
        for n in ns:
            print(f"RATIO baseline_relay_tokens_per_s_n{n} = {ratio('base', n):.3f} (before this checkout)")
            print(f"RATIO baseline_added_ttft_p50_ms_n{n} = {ttft('base', n) - ttft('direct', n):+.2f}")
            print(f"RATIO werk_cpu_per_token_vs_baseline_n{n} = {cpu('werk', n) / cpu('base', n):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
