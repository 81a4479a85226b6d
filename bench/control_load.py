"""Control-plane throughput: 32 keep-alive clients on three ``/werk/v1`` routes, Werk vs its own floor.

Targets, each a separate process on loopback, all waitress with the same settings and thread
count (``werk_host.server.make_server``, ``--threads``, default ``werk serve``'s 8):

* ``werk`` - a real ``werk serve`` subprocess (llama.cpp backend, a generated model), with 100
  named states committed through ``POST /werk/v1/prefill`` first;
* ``floor`` - Werk's own HTTP layer with nothing behind it: the host ``werk serve`` builds
  (``build_host``, same model, same thread count) whose service hands out, for each of the three
  routes, the very answer ``werk`` gave (bench code; the production service is untouched).
  Every request still pays authentication, negotiation, the request id, the deployment
  selection, the metrics, the protocol headers, body validation and the envelope.
  ``floor/bare`` is the most any service behind this HTTP layer could reach, and
  ``werk - floor`` (microseconds per request) is what the service itself costs;
* ``bare`` - a bare falcon app (no middleware, no auth) answering each route with the very
  bytes Werk answered it with (same size, same content type).

Routes: ``GET /werk/v1/capabilities``, ``GET /werk/v1/states?limit=100`` and
``POST /werk/v1/chat/count_tokens`` (one fixed request: the adapter's count cache serves it,
as it serves a client that plans the same request twice).

The load: ``--clients`` (32) connections kept alive, each sending its next request as soon as
its previous answer is read, driven by one ``selectors`` loop in this process (a raw-socket
client, so the client costs little of the 2 cores). For each route, ``--rounds`` rounds of
``--seconds`` each run the three targets in an order that rotates and reverses from round to
round, after a warm-up. Prints requests/s and the p50
and p99 latency per route and target, and per route the throughput ratio werk/floor: the median
over rounds of werk's rate over the floor's in the same round (a shared machine drifts by tens
of percent between seconds; the ratio of the two medians is printed beside it), werk/bare and
floor/bare for reference, and the service's share. Then one line per route,
``RATIO werk_over_floor_<route> = X (target >= 0.85)``: the floor is the honest reference (Werk's
own HTTP layer over Werk's own answers), so the service may cost at most 15 % of it.

CPUs: with two or more, the servers (both measured in turn, never at once) run on every CPU but
the first, and the load generator alone on the first (``--no-pin``: all share all). Unpinned, the
generator competes with the server for the same two cores and the bare app's rate swung between
3,300 and 7,900 req/s from run to run, so the ratio mostly measured that competition; pinned,
each server's own cost per request decides its rate, and repeated runs agree within a few
hundredths.

    .venv/bin/python bench/control_load.py [--clients 32] [--seconds 1] [--rounds 12] [--threads 8]
        [--route NAME] [--no-pin]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import secrets
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from werk_llamacpp.testing.testmodel import generate_model  # noqa: E402

from bench.proxy_overhead import KEY, MODEL, Target, git_describe, llama_server, werk_serve  # noqa: E402
from werk_host.models import ModelManifest, ModelRegistry  # noqa: E402

TARGET = 0.85
TARGETS = ("werk", "floor", "bare")
STATES = 100
COUNT_BODY = json.dumps({"messages": [{"role": "user", "content": "how many tokens is this request?"}]}).encode()
ROUTES: tuple[tuple[str, str, bytes | None], ...] = (
    ("capabilities", "/werk/v1/capabilities", None),
    ("states", "/werk/v1/states?limit=100", None),
    ("count_tokens", "/werk/v1/chat/count_tokens", COUNT_BODY),
)


def request_bytes(path: str, body: bytes | None, auth: bool) -> bytes:
    method = "POST" if body is not None else "GET"
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Accept: application/json"]
    if auth:
        head.append(f"Authorization: Bearer {KEY}")
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + (body or b"")


@dataclass
class Conn:
    sock: socket.socket
    request: bytes
    started: float = 0.0
    buf: bytearray = field(default_factory=bytearray)
    need: int = -1  # total bytes of the response being read, once its head is in


def _response_size(buf: bytearray) -> int:
    """Head + Content-Length of a complete response head in ``buf``, or -1 if not yet in."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return -1
    head = bytes(buf[:end]).decode("latin-1")
    status = head.split(" ", 2)[1]
    if status != "200":
        raise RuntimeError(f"answered {head.splitlines()[0]}: {bytes(buf[:400])!r}")
    for line in head.split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            return end + 4 + int(value)
    raise RuntimeError(f"no Content-Length in {head!r}")


def load(port: int, request: bytes, clients: int, seconds: float) -> list[float]:
    """Latencies (ms) of every request completed by ``clients`` keep-alive connections in ``seconds``."""
    sel = selectors.DefaultSelector()
    conns = []
    for _ in range(clients):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        conn = Conn(sock, request)
        conns.append(conn)
        sel.register(sock, selectors.EVENT_READ, conn)
    latencies: list[float] = []
    now = time.perf_counter()
    deadline = now + seconds
    for conn in conns:
        conn.started = now
        conn.sock.sendall(conn.request)
    try:
        while True:
            for key, _ in sel.select(timeout=1.0):
                conn = key.data
                chunk = conn.sock.recv(1 << 20)
                if not chunk:
                    raise RuntimeError("the server closed a keep-alive connection")
                conn.buf += chunk
                if conn.need < 0:
                    conn.need = _response_size(conn.buf)
                if conn.need < 0 or len(conn.buf) < conn.need:
                    continue
                done = time.perf_counter()
                latencies.append((done - conn.started) * 1000.0)
                del conn.buf[: conn.need]
                conn.need = -1
                if done < deadline:
                    conn.started = done
                    conn.sock.sendall(conn.request)
                else:
                    sel.unregister(conn.sock)
            if not sel.get_map():
                return latencies
    finally:
        for conn in conns:
            conn.sock.close()
        sel.close()


# -- the bare app (run as a subprocess: ``--bare BODIES_JSON``) ----------------------------------
def serve_bare(bodies_file: Path, threads: int) -> None:
    import falcon

    from werk_host.config import ServerLimits
    from werk_host.server import make_server

    bodies: dict[str, str] = json.loads(bodies_file.read_text())

    class Canned:
        def __init__(self, body: bytes) -> None:
            self.body = body

        def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
            resp.content_type = "application/json"
            resp.data = self.body

        def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
            req.bounded_stream.read()
            resp.content_type = "application/json"
            resp.data = self.body

    app = falcon.App()
    for name, path, _ in ROUTES:
        app.add_route(path.split("?")[0], Canned(bodies[name].encode()))
    server = make_server(app, "127.0.0.1", 0, ServerLimits(threads=threads))
    print(json.dumps({"port": server.getsockname()[1]}), flush=True)
    server.run()


def paired_ratio(over: list[float], under: list[float]) -> float:
    """The median over rounds of ``over``'s rate divided by ``under``'s in the same round."""
    return statistics.median(o / u for o, u in zip(over, under, strict=True))


def serve_floor(home: Path, bodies_file: Path, threads: int) -> None:
    """The ``floor`` target (module docstring), answering with Werk's own answers (``bodies_file``):
    run with ``werk serve``'s environment."""
    from pydantic import TypeAdapter

    from werk_host.config import HostConfig, ServerLimits
    from werk_host.protocol import Capability, StatePage, TokenCount
    from werk_host.server import build_host, make_server
    from werk_host.service.cache import Shared

    data = {name: json.loads(body)["data"] for name, body in json.loads(bodies_file.read_text()).items()}
    answers: dict[str, object] = {  # the two listings come from the service's cache layer, kept
        "capabilities": Shared(TypeAdapter(tuple[Capability, ...]).validate_python(data["capabilities"])),
        "list_states": Shared(StatePage.model_validate(data["states"])),
        "count_tokens": TokenCount.model_validate(data["count_tokens"]),
    }
    limits = ServerLimits(threads=threads)
    host = build_host(HostConfig(home=home, api_keys=(KEY,), models=(MODEL,), limits=limits))
    for name, answer in answers.items():
        setattr(host.service, name, lambda *args, _answer=answer: _answer)
    server = make_server(host.app, "127.0.0.1", 0, limits)
    print(json.dumps({"port": server.getsockname()[1]}), flush=True)
    try:
        server.run()
    finally:
        host.close()


#: The stages of the count_tokens breakdown (:func:`breakdown`), each adding one part of the
#: service's path to the floor's canned answer: what each costs is its difference from the one before.
STAGES = (
    ("floor", "the canned answer"),
    ("in_flight", "RequestScope.started/close: Instance.use(enter=True)/leave"),
    ("gate", "CapabilityResolver.one: the evidence key (adapter identity, operation count, window) and gate"),
    ("count", "the adapter's own werk_count_tokens method, called directly (llama.cpp: its body-keyed cache)"),
    ("dispatch", "the same through BackendHooks.count_tokens: PluginHost.dispatch and pluggy"),
    ("werk", "the service's count_tokens (ChatPlanning: request options, tier, the TokenCount)"),
)


def _own_method(adapter: object, spec: str) -> Callable[..., object]:
    """The adapter's method implementing operation hook ``spec`` (its ``@hookimpl`` marker)."""
    for name in dir(type(adapter)):
        marker = getattr(inspect.getattr_static(type(adapter), name, None), "werk_impl", None)
        if isinstance(marker, dict) and (marker.get("specname") or name) == spec:
            method: Callable[..., object] = getattr(adapter, name)
            return method
    raise RuntimeError(f"{type(adapter).__name__} has no {spec} method")


def breakdown(home: Path, calls: int) -> None:
    """Where count_tokens' service share goes, in process: the host ``werk serve`` builds, its WSGI
    app called directly (no sockets, one thread) with the bench's request, the service replaced by
    each of :data:`STAGES` in turn; the thread CPU time per request, the minimum over rounds
    (interleaved), is printed as one JSON object (run with ``werk serve``'s environment)."""
    import io

    from werk_host.config import HostConfig, ServerLimits
    from werk_host.protocol import CapabilityId, ChatRequest, TokenCount
    from werk_host.server import build_host
    from werk_host.service.scope import RequestScope

    host = build_host(HostConfig(home=home, api_keys=(KEY,), models=(MODEL,), limits=ServerLimits()))
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/werk/v1/chat/count_tokens",
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "HTTP_HOST": "127.0.0.1",
        "HTTP_ACCEPT": "application/json",
        "HTTP_AUTHORIZATION": f"Bearer {KEY}",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(COUNT_BODY)),
        "wsgi.url_scheme": "http",
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
        "wsgi.version": (1, 0),
    }

    def start_response(status: str, headers: Any, exc_info: Any = None) -> Any:
        if not status.startswith("200"):
            raise RuntimeError(f"count_tokens answered {status}")

    def call() -> bytes:
        return b"".join(host.app({**environ, "wsgi.input": io.BytesIO(COUNT_BODY)}, start_response))

    service, planning = host.service, host.service.planning
    try:
        canned = TokenCount.model_validate(json.loads(call())["data"])

        def gated(scope: RequestScope, request: ChatRequest) -> object:
            return planning._using(planning._one(scope, request.model), CapabilityId.TOKEN_COUNT, "token counting")

        def in_flight(scope: RequestScope, request: ChatRequest) -> TokenCount:
            scope.started()
            return canned

        def gate(scope: RequestScope, request: ChatRequest) -> TokenCount:
            gated(scope, request)
            return canned

        methods: dict[int, Callable[..., object]] = {}  # looked up once per adapter

        def count(scope: RequestScope, request: ChatRequest) -> TokenCount:
            adapter = gated(scope, request)
            method = methods.get(id(adapter))
            if method is None:
                method = methods[id(adapter)] = _own_method(adapter, "werk_count_tokens")
            method(request)
            return canned

        def dispatch(scope: RequestScope, request: ChatRequest) -> TokenCount:
            planning.hooks.count_tokens(gated(scope, request), request)  # type: ignore[arg-type]
            return canned

        stages = {
            "floor": lambda *_: canned,
            "in_flight": in_flight,
            "gate": gate,
            "count": count,
            "dispatch": dispatch,
            "werk": service.count_tokens,
        }
        best = dict.fromkeys(stages, float("inf"))
        for round_no in range(12):
            for name in stages if round_no % 2 == 0 else list(stages)[::-1]:
                service.count_tokens = stages[name]  # type: ignore[method-assign]
                for _ in range(calls // 10):
                    call()
                started = time.thread_time()
                for _ in range(calls):
                    call()
                best[name] = min(best[name], (time.thread_time() - started) / calls * 1e6)
        print(json.dumps(best), flush=True)
    finally:
        host.close()


def run_breakdown(home: Path, work: Path, server: Path) -> dict[str, float]:
    copy = work / "breakdown-home"  # a copy, like the floor's
    shutil.copytree(home, copy, ignore=shutil.ignore_patterns("backends", "*.log"))
    env = {**os.environ, "WERK_LLAMA_SERVER": str(server), "WERK_LLAMA_ARGS": "-t 1"}
    done = subprocess.run(
        [sys.executable, __file__, "--breakdown", str(copy)], capture_output=True, text=True, cwd=ROOT, env=env
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    found: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def start_target(args: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], int]:
    """This script as the server ``args`` name (``--bare`` or ``--floor``) and its port."""
    proc = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    assert proc.stdout is not None
    return proc, int(json.loads(proc.stdout.readline())["port"])


def save_bodies(bodies: dict[str, bytes], work: Path) -> Path:
    path = work / "bodies.json"
    path.write_text(json.dumps({k: v.decode() for k, v in bodies.items()}))
    return path


def start_floor(home: Path, bodies: Path, server: Path, threads: int) -> tuple[subprocess.Popen[str], int]:
    floor_home = bodies.parent / "floor-home"  # a copy: the same key namespace and model
    shutil.copytree(home, floor_home, ignore=shutil.ignore_patterns("backends", "*.log"))
    env = {**os.environ, "WERK_LLAMA_SERVER": str(server), "WERK_LLAMA_ARGS": "-t 1"}
    return start_target(["--floor", str(floor_home), "--bodies", str(bodies), "--threads", str(threads)], env)


def make_states(port: int, n: int) -> None:
    api = Target(port, "/werk/v1/prefill", {"Authorization": f"Bearer {KEY}"})
    for i in range(n):
        body = {
            "model_id": MODEL,
            "input": {"type": "text", "text": f"state {i} {secrets.token_hex(4)} of the control-load catalog"},
            "allow_experimental": True,
        }
        api.post(json.dumps(body).encode())


def fetch(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(request)
        buf = bytearray()
        need = -1
        while need < 0 or len(buf) < need:
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise RuntimeError(f"connection closed: {bytes(buf[:300])!r}")
            buf += chunk
            need = _response_size(buf) if need < 0 else need
        return bytes(buf[buf.find(b"\r\n\r\n") + 4 : need])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=1.0, help="length of one measured phase")
    parser.add_argument("--rounds", type=int, default=12, help="rounds per route (even)")
    parser.add_argument("--threads", type=int, default=8, help="waitress threads, both targets")
    parser.add_argument("--route", action="append", choices=[name for name, _, _ in ROUTES], help="only these routes")
    parser.add_argument("--no-pin", action="store_true", help="let the load generator share the servers' CPUs")
    parser.add_argument("--bare", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--floor", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--bodies", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--breakdown", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.breakdown is not None:
        breakdown(args.breakdown, 2000)
        return 0
    if args.bare is not None:
        serve_bare(args.bare, args.threads)
        return 0
    if args.floor is not None:
        serve_floor(args.floor, args.bodies, args.threads)
        return 0

    measured = [route for route in ROUTES if not args.route or route[0] in args.route]
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []  # Linux only
    pinned = len(cpus) >= 2 and not args.no_pin
    if pinned:
        os.sched_setaffinity(0, cpus[1:])  # inherited by both servers (and werk serve's child)
    server = llama_server()
    work = Path(tempfile.mkdtemp(prefix="werk-bench-control-"))
    model = generate_model(work / "bench.gguf")
    home = work / "home"
    home.mkdir()
    ModelRegistry(home).add(ModelManifest.from_paths(MODEL, [model], backend="llama.cpp"))
    with werk_serve(home, server, 1, extra=["--threads", str(args.threads)]) as (werk_port, _, _):
        make_states(werk_port, STATES)
        requests = {name: request_bytes(path, body, auth=True) for name, path, body in ROUTES}
        bodies = {name: fetch(werk_port, requests[name]) for name, _, _ in ROUTES}
        assert bodies["states"].count(b'"id":"st_') == STATES, bodies["states"][:300]
        saved = save_bodies(bodies, work)
        bare, bare_port = start_target(["--bare", str(saved), "--threads", str(args.threads)])
        floor, floor_port = start_floor(home, saved, server, args.threads)
        if pinned:
            os.sched_setaffinity(0, cpus[:1])  # the load generator keeps a CPU of its own
        try:
            ports = {"werk": werk_port, "floor": floor_port, "bare": bare_port}
            for name, _, _ in ROUTES:
                assert fetch(bare_port, requests[name]) == bodies[name]
                assert len(fetch(floor_port, requests[name])) == len(bodies[name])  # all but the request id
            results: dict[str, dict[str, list[float]]] = {}
            rates: dict[str, dict[str, list[float]]] = {}
            for name, _, _ in measured:
                results[name] = {target: [] for target in TARGETS}
                rates[name] = {target: [] for target in TARGETS}
                for target in TARGETS:  # warm-up
                    load(ports[target], requests[name], args.clients, args.seconds / 2)
                for round_no in range(args.rounds):
                    turn = round_no // 2 % len(TARGETS)
                    order = TARGETS[turn:] + TARGETS[:turn]
                    for target in order if round_no % 2 == 0 else order[::-1]:
                        latencies = load(ports[target], requests[name], args.clients, args.seconds)
                        results[name][target] += latencies
                        rates[name][target].append(len(latencies) / args.seconds)
        finally:
            for proc in (bare, floor):
                proc.terminate()
                proc.wait(timeout=30)

    print(
        f"commit {git_describe()} | werk serve (llama.cpp, generated model, {STATES} states) vs its HTTP layer "
        "over werk's own answers (floor) vs bare falcon app "
        f"| waitress threads {args.threads} each | {args.clients} keep-alive clients | {args.rounds} rounds "
        f"x {args.seconds}s per route and target | {platform.machine()} {os.cpu_count()} CPUs "
        f"| load {os.getloadavg()[0]:.2f} | "
        + (f"servers on CPUs {cpus[1:]}, load generator on CPU {cpus[0]}" if pinned else "not pinned")
    )
    ratios = {}
    for name, path, body in measured:
        line = [f"  {('POST ' if body else 'GET ') + path:<36} body {len(bodies[name]):>6} B"]
        for target in TARGETS:
            rps = statistics.median(rates[name][target])
            lat = results[name][target]
            line.append(
                f"{target} {rps:7.0f} req/s p50 {percentile(lat, 0.5):6.2f} ms p99 {percentile(lat, 0.99):6.2f} ms"
            )
        # per round, werk's rate over the floor's in the same round: less sensitive to the drift
        # of a shared machine than the ratio of the medians (printed too)
        ratios[name] = paired_ratio(rates[name]["werk"], rates[name]["floor"])
        medians = statistics.median(rates[name]["werk"]) / statistics.median(rates[name]["floor"])
        werk_bare = paired_ratio(rates[name]["werk"], rates[name]["bare"])
        floor_bare = paired_ratio(rates[name]["floor"], rates[name]["bare"])
        service_us = 1e6 / statistics.median(rates[name]["werk"]) - 1e6 / statistics.median(rates[name]["floor"])
        line.append(f"werk/floor {ratios[name]:.2f} (of medians {medians:.2f})")
        line.append(f"werk/bare {werk_bare:.2f} | floor/bare {floor_bare:.2f}")
        line.append(f"service share {service_us:5.1f} us/request")
        print(" | ".join(line))
    if any(name == "count_tokens" for name, _, _ in measured):
        stages = run_breakdown(home, work, server)
        parts = [f"{name} {stages[name]:.1f}" for name, _ in STAGES[:1]]
        parts += [
            f"+{name} {stages[name] - stages[prev]:+.1f}"
            for (prev, _), (name, _) in zip(STAGES, STAGES[1:], strict=False)
        ]
        print(
            "  count_tokens in process (thread CPU us/request, min of 12 rounds; each stage adds one part): "
            + " | ".join(parts)
            + f" | service share {stages['werk'] - stages['floor']:.1f}"
        )
        for name, what in STAGES:
            print(f"    {name:<9} {what}")
    for name, _, _ in measured:
        print(f"RATIO werk_over_floor_{name} = {ratios[name]:.2f} (target >= {TARGET})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
