"""Embeddings through ``werk serve`` vs the same llama-server directly (docs/embeddings.md).

One ``werk serve`` subprocess serves one embedding instance (a profile instance with
``pooling = "mean"``) of SmolLM2-135M-Instruct (the real model, ``--model smollm2``, default) or
the generated tiny embedding GGUF (``--model generated``). Beside it runs a bare llama-server
with Werk's child's own command line (read from ``/proc``: the same flags, ``--embeddings
--pooling mean -ub/-b`` at the slot context and ``--kv-unified``), its own port and no API key.
Both get, alternately (ABBA, ``--reps`` times):

* **throughput**: ``--inputs`` (1,000) short distinct inputs in batches of ``--batch`` (32),
  from ``--clients`` (2) concurrent clients, to ``POST /v1/embeddings``; inputs per second;
* **single-input latency**: ``--singles`` (200) requests of one short input, one at a time;
  the added latency is Werk's p50 minus direct's p50. The same requests also go through the
  **floor**, a bare waitress WSGI relay in its own process in front of the bare llama-server
  (``bench.proxy_overhead.floor_proxy``: no framework, auth, admission or accounting), whose added
  p50 the ``RATIO`` line prints beside the target: what any Python relay on waitress adds here.

The vectors of the first batch are compared (Werk's equal the engine's to 1e-5) before timing.
Each client keeps one keep-alive ``http.client`` connection. The ``werk CPU`` figure is the
``werk serve`` process's CPU time per request (its threads' run time from ``/proc``).

Ends with ``RATIO embeddings_throughput_vs_direct`` (target >= 0.95) and
``RATIO embeddings_single_added_latency_p50_ms`` (target <= 1).

    .venv/bin/python bench/embeddings.py [--model smollm2|generated] [--reps 3] [--inputs 1000]
        [--batch 32] [--clients 2] [--singles 200]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from werk_llamacpp.testing.testmodel import generate_model  # noqa: E402

from bench.proxy_overhead import llama_server  # noqa: E402
from bench.relay_throughput import cpu_s, floor_relay  # noqa: E402

KEY = "sk-werk-bench-embeddings"
PROFILE = """
[[instance]]
id = "emb"
model = "{model}"
preload = true
options = {{ pooling = "mean", parallel = 4, ctx = 2048 }}
"""
WERK_ARGS = ("--threads", "32", "--inference-max", "24", "--inference-per-key", "24")


def say(message: str) -> None:
    print(f"[embeddings] {message}", file=sys.stderr, flush=True)


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Client:
    """One keep-alive connection posting ``/v1/embeddings``."""

    def __init__(self, port: int, key: str | None) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        self.headers = {"Content-Type": "application/json"}
        if key is not None:
            self.headers["Authorization"] = f"Bearer {key}"

    def embed(self, inputs: list[str]) -> dict[str, object]:
        body = json.dumps({"model": "emb", "input": inputs}).encode()
        self.conn.request("POST", "/v1/embeddings", body=body, headers=self.headers)
        response = self.conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {data[:300]!r}")
        answer: dict[str, object] = json.loads(data)
        return answer

    def close(self) -> None:
        self.conn.close()


@contextmanager
def werk(home: Path, profile: Path, server: str) -> Iterator[tuple[int, int, int]]:
    """(port, werk pid, its llama-server child's pid)."""
    env = {**os.environ, "WERK_HOME": str(home), "WERK_API_KEYS": KEY, "WERK_LLAMA_SERVER": server}
    env.pop("WERK_LLAMA_ARGS", None)
    log = open(home.with_name("serve.log"), "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "werk_host", "serve", "--port", "0", "--profile", str(profile), *WERK_ARGS],
        stdout=subprocess.PIPE,
        stderr=log,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(home.with_name("serve.log").read_text()[-3000:])
        port = int(json.loads(line)["port"])
        Client(port, KEY).embed(["warm up"])  # the preloaded child answers
        children = [c for c in psutil.Process(proc.pid).children(recursive=True) if "llama-server" in c.name()]
        yield port, proc.pid, children[0].pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@contextmanager
def direct(child_pid: int, log_path: Path) -> Iterator[int]:
    """A bare llama-server with Werk's child's command line, its own port, no API key."""
    argv = Path(f"/proc/{child_pid}/cmdline").read_bytes().split(b"\0")[:-1]
    port = _port()
    cmd = [a.decode() for a in argv]
    cmd[cmd.index("--port") + 1] = str(port)
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_API_KEY"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(log_path.read_text(errors="replace")[-2000:])
            try:
                Client(port, None).embed(["warm up"])
                break
            except (OSError, RuntimeError, http.client.HTTPException):
                time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def throughput(port: int, key: str | None, inputs: list[str], batch: int, clients: int) -> float:
    """Inputs per second for ``inputs`` in batches of ``batch`` over ``clients`` connections."""
    batches = [inputs[i : i + batch] for i in range(0, len(inputs), batch)]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work() -> None:
        client = Client(port, key)
        try:
            while True:
                with lock:
                    if not batches:
                        return
                    mine = batches.pop()
                client.embed(mine)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)
        finally:
            client.close()

    threads = [threading.Thread(target=work) for _ in range(clients)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return len(inputs) / (time.perf_counter() - began)


def singles(port: int, key: str | None, count: int) -> list[float]:
    client = Client(port, key)
    try:
        out = []
        for i in range(count):
            began = time.perf_counter()
            client.embed([f"single input {i}"])
            out.append((time.perf_counter() - began) * 1000)
        return out
    finally:
        client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("smollm2", "generated"), default="smollm2")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--inputs", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--singles", type=int, default=200)
    args = parser.parse_args()
    server = str(llama_server())
    with tempfile.TemporaryDirectory(prefix="werk-bench-embed-") as tmp:
        work = Path(tmp)
        if args.model == "smollm2":
            from werk_host.realmodel import smollm2_gguf

            model, described = smollm2_gguf(), "SmolLM2-135M-Instruct Q4_1 (real), mean pooling"
        else:
            model, described = generate_model(work / "embed.gguf", pooling="mean"), "generated tiny embedding GGUF"
        profile = work / "deployments.toml"
        profile.write_text(PROFILE.format(model=model))
        home = work / "home"
        home.mkdir()
        say(f"model: {described}; {args.inputs} inputs in batches of {args.batch} from {args.clients} clients")
        texts = [f"short input number {i} about topic {i % 17}" for i in range(args.inputs)]
        with (
            werk(home, profile, server) as (port, werk_pid, child),
            direct(child, work / "direct.log") as bare,
            floor_relay(bare, " ".join(WERK_ARGS)) as (floor, _floor_pid),
        ):
            ours = Client(port, KEY).embed(texts[: args.batch])["data"]
            theirs = Client(bare, None).embed(texts[: args.batch])["data"]
            worst = max(
                abs(a - b)
                for x, y in zip(ours, theirs, strict=True)  # type: ignore[call-overload]
                for a, b in zip(x["embedding"], y["embedding"], strict=True)
            )
            say(f"vectors: Werk vs direct, largest difference {worst:.2e}")
            assert worst <= 1e-5
            rates: dict[str, list[float]] = {"werk": [], "direct": []}
            lat: dict[str, list[float]] = {"werk": [], "direct": [], "floor": []}
            cpu: list[float] = []
            for rep in range(args.reps):
                order = ("werk", "direct") if rep % 2 == 0 else ("direct", "werk")
                for name in order:
                    target, key = (port, KEY) if name == "werk" else (bare, None)
                    before = cpu_s(werk_pid)
                    rates[name].append(throughput(target, key, texts, args.batch, args.clients))
                    lat[name] += singles(target, key, args.singles)
                    if name == "werk":
                        requests = -(-args.inputs // args.batch) + args.singles
                        cpu.append((cpu_s(werk_pid) - before) / requests * 1000)
                lat["floor"] += singles(floor, None, args.singles)
                say(f"rep {rep + 1}: werk {rates['werk'][-1]:.0f}/s, direct {rates['direct'][-1]:.0f}/s")
        ratios = [w / d for w, d in zip(rates["werk"], rates["direct"], strict=True)]
        p50 = {name: statistics.median(values) for name, values in lat.items()}
        print(f"model: {described}")
        print("| target | inputs/s (median) | single-input p50 ms | p90 ms |")
        print("| --- | ---: | ---: | ---: |")
        for name in ("direct", "werk", "floor"):
            values = sorted(lat[name])
            p90 = values[int(0.9 * (len(values) - 1))]
            rate = f"{statistics.median(rates[name]):.0f}" if rates.get(name) else "-"
            print(f"| {name} | {rate} | {p50[name]:.2f} | {p90:.2f} |")
        print(f"werk serve CPU per request: {statistics.median(cpu):.2f} ms")
        print(f"RATIO embeddings_throughput_vs_direct = {statistics.median(ratios):.3f} (target >= 0.95)")
        added = p50["werk"] - p50["direct"]
        floor = p50["floor"] - p50["direct"]
        print(f"RATIO embeddings_single_added_latency_p50_ms = {added:.3f} (target <= 1; floor {floor:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
