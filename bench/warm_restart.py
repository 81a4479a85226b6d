"""First token after a full restart: Werk's prompt cache beside the PyPI peers hearth-llm and stillwarm.

Every system runs in front of the same ``llama-server`` binary (``scripts/build-llama-server.sh``,
cached), the same real model (SmolLM2-135M-Instruct Q4_1, :mod:`werk_host.realmodel`), the same
threads (``--threads``, default 1), the same per-request context and ``--no-warmup``; every
request is the same plain streamed ``POST /v1/chat/completions`` (temperature 0, seed 42,
``max_tokens`` 8), and the first token is the first SSE chunk with content. The document
(``--tokens``, default about 6,000, cut with the model's own tokenizer) is generated from a
fixed seed, so every run asks the same thing.

Systems (``--only`` picks one):

* ``werk``: ``werk serve --model doc`` (model registered from the GGUF in a fresh ``WERK_HOME``,
  ``WERK_API_KEYS``: prompt caches are per key) with its automatic prompt cache at its default
  budget (issue 31); ``werk-nocache``: the same with ``--prompt-cache-budget 0`` (skipped, with
  the reason, when ``werk serve --help`` does not list the option);
* ``hearth``: ``hearth serve`` of ``hearth-llm==0.1.1`` (it starts llama-server itself);
* ``stillwarm``: ``stillwarm==0.1.1``'s ``Session`` behind the small proxy of
  :mod:`bench._peers` (stillwarm ships no proxy); each peer lives in its own virtualenv under
  ``${XDG_CACHE_HOME:-~/.cache}/werk/bench/<dist>-<version>/venv``, installed once.

For each system:

1. ``--rounds`` rounds, each on fresh state: cold first token; then a full restart (proxy and
   llama-server stopped, started again) and the same request: first token after the restart,
   and whether the answer equals the cold one;
2. a 10-turn conversation about the document, with a full restart before turns 5 and 8;
3. two models alternating on one slot (the GGUF and a copy under another name, each with its own
   document, 6 steps A B A B A B, each continuing that model's conversation): the peers restart
   with the other model at each step (the swap is part of the figure); Werk serves a profile
   with two instances of ``keep_alive = 0`` (each stops after its request, so one is loaded at a
   time: Werk has no setting for "one slot shared by two models");
4. the raw figure: llama-server alone (``--slot-save-path``, Werk's slot count for Werk's file),
   ``POST /slots/0?action=restore`` of the file Werk saved for the document (else a peer's file
   of the same prompt, named), then the same request. Werk's restore share (verify + restore) is
   its own ``/metrics`` figure, ``werk_chat_prompt_cache_restore_ms_total`` per hit; everything
   Werk adds to a restored request, seen from outside, is its first token after a restart minus
   llama-server's first token right after the raw restore (printed beside it, no target).

Between requests the bench waits until the system's processes are idle (their CPU time stops
moving: saves, probes and hashing after an answer finish first), as a reader would. The last
lines are one ``RATIO name = X (target ...)`` per figure.

    .venv/bin/python -m bench.warm_restart [--rounds 3] [--quick] [--only werk|hearth|stillwarm]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import _peers  # noqa: E402
from werk_host.models import ModelManifest, ModelRegistry  # noqa: E402
from werk_host.realmodel import SHA256 as SMOLLM2_SHA256  # noqa: E402
from werk_host.realmodel import smollm2_gguf  # noqa: E402

KEY = "sk-werk-bench-warm-restart"
ANSWER_TOKENS = 8
SEED = 31
TURNS = 10
RESTART_BEFORE = (5, 8)
ALTERNATION = "ABABAB"
TARGET_RESTART_VS_COLD = 0.03
TARGET_VS_BEST_PEER = 0.8
TARGET_SHARE_VS_RAW = 1.2
QUESTIONS = [
    "Which warehouse reported the most damaged crates? Answer in one short sentence.",
    "Who chaired the committee?",
    "What happened in section 12?",
    "Name one shipment that arrived late.",
    "Which region is mentioned most often?",
    "What did the auditors recommend?",
    "Summarise the document in five words.",
    "Was any shipment lost?",
    "Which month had the most deliveries?",
    "What should the committee do next?",
]
WERK_MODELS = {"A": "doc", "B": "doc-b"}


class BenchError(RuntimeError):
    """A system could not be measured; the message says why."""


def say(message: str) -> None:
    _peers.say(message)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def llama_server_binary() -> Path:
    """``$WERK_LLAMA_SERVER``, else the cached build (``scripts/build-llama-server.sh | tail -n1``)."""
    if os.environ.get("WERK_LLAMA_SERVER"):
        return Path(os.environ["WERK_LLAMA_SERVER"])
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build-llama-server.sh")], check=True, stdout=subprocess.PIPE, text=True
    ).stdout
    return Path(out.strip().splitlines()[-1])


def second_model(gguf: Path) -> Path:
    """A copy of the GGUF under another name: the alternation's model B (cached beside the peers)."""
    target = _peers.bench_cache() / "models" / gguf.name.replace(".Q4_1", "-B.Q4_1")
    if not target.is_file() or target.stat().st_size != gguf.stat().st_size:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".partial")
        shutil.copyfile(gguf, tmp)
        os.replace(tmp, target)
    return target


# -- HTTP ----------------------------------------------------------------------------------------------------------


def http_json(port: int, method: str, path: str, payload: object = None, timeout: float = 600) -> Any:
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"null")


def wait_http(port: int, path: str, proc: subprocess.Popen[Any], what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"{what} exited with code {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
                if resp.status == 200:
                    return
        except (OSError, urllib.error.HTTPError):
            pass
        time.sleep(0.1)
    raise BenchError(f"{what} not ready after {timeout:.0f} s")


@dataclass
class Reply:
    ttft_ms: float
    total_ms: float
    text: str
    usage: dict[str, Any]
    timings: dict[str, Any]
    headers: dict[str, str]

    def evidence(self) -> str:
        bits = []
        details = self.usage.get("prompt_tokens_details") or {}
        if self.usage:
            bits.append(f"prompt {self.usage.get('prompt_tokens')}, cached {details.get('cached_tokens', '-')}")
        if self.timings:
            bits.append(f"llama prompt_n {self.timings.get('prompt_n')}, cache_n {self.timings.get('cache_n')}")
        for name, value in self.headers.items():
            if name.lower().startswith(("x-hearth-cache", "x-hearth-restored-tokens", "x-stillwarm")):
                bits.append(f"{name} {value}")
        return "; ".join(bits)


def chat(port: int, model: str, messages: list[dict[str, str]], key: str | None = None) -> Reply:
    """One streamed ``/v1/chat/completions``; first token = the first SSE chunk with content."""
    body = {
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
        "seed": 42,
        "max_tokens": ANSWER_TOKENS,
    }
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=7200)
    try:
        start = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
        resp = conn.getresponse()
        if resp.status != 200:
            raise BenchError(f"/v1/chat/completions answered {resp.status}: {resp.read()[:400]!r}")
        first: float | None = None
        parts: list[str] = []
        usage: dict[str, Any] = {}
        timings: dict[str, Any] = {}
        # Read to the end of the response, past [DONE]: a proxy that saves after the answer may treat a
        # client gone before its last chunk as a cancelled answer (hearth does) and save nothing.
        while line := resp.readline():
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("error"):
                raise BenchError(f"stream error: {chunk['error']}")
            for choice in chunk.get("choices") or []:
                content = (choice.get("delta") or {}).get("content")
                if content:
                    first = first or time.perf_counter()
                    parts.append(content)
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
        end = time.perf_counter()
        first = first or end
        return Reply(
            (first - start) * 1000, (end - start) * 1000, "".join(parts), usage, timings, dict(resp.getheaders())
        )
    finally:
        conn.close()


# -- idleness -------------------------------------------------------------------------------------------------------


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _cpu_ticks(root: int) -> int:
    total = 0
    for pid in _tree(root):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total


def quiesce(root: int | None, *, minimum: float, timeout: float = 600) -> float:
    """Wait until the process tree under ``root`` is idle (CPU <= ~4% for 1 s); seconds waited."""
    start = time.monotonic()
    time.sleep(minimum)
    if root is None:
        return time.monotonic() - start
    quiet, last = 0, _cpu_ticks(root)
    while time.monotonic() - start < timeout:
        time.sleep(0.5)
        now = _cpu_ticks(root)
        quiet = quiet + 1 if now - last <= 2 else 0
        last = now
        if quiet >= 2:
            break
    else:
        say(f"still busy after {timeout:.0f} s; measuring anyway")
    return time.monotonic() - start


# -- the systems ----------------------------------------------------------------------------------------------------


@dataclass
class Setup:
    server: Path
    models: dict[str, Path]
    slot_ctx: int
    threads: int
    work: Path


class System:
    """One system under test: started, stopped, asked; fresh state per round."""

    name = ""
    label = ""
    key: str | None = None

    def __init__(self, setup: Setup) -> None:
        self.setup = setup
        self.proc: subprocess.Popen[Any] | None = None
        self.port = 0
        self.model = "A"
        self.state: Path = setup.work
        self.round = 0

    def fresh_state(self) -> None:
        self.round += 1
        self.state = self.setup.work / f"{self.name}-{self.round}"
        self.state.mkdir(parents=True)

    def log(self) -> Any:
        return open(self.setup.work / f"{self.name}.log", "ab")

    def start(self, model: str = "A") -> float:
        """Start it serving ``model``; ms until it was ready."""
        raise NotImplementedError

    def request_model(self, model: str) -> str:
        return model

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            say(f"{self.name}: still running 180 s after SIGTERM; killing its process group")
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def ask(self, messages: list[dict[str, str]], model: str | None = None) -> Reply:
        return chat(self.port, self.request_model(model or self.model), messages, self.key)

    def saved_files(self) -> list[Path]:
        """Files this system saved for the document (candidates for the raw restore), largest first."""
        return []

    def popen(self, cmd: list[str], env: dict[str, str] | None = None, stdout: Any = None) -> subprocess.Popen[Any]:
        with self.log() as log:
            log.write(f"\n== {time.strftime('%H:%M:%S')} {' '.join(cmd)}\n".encode())
            log.flush()
            return subprocess.Popen(
                cmd, stdout=stdout or log, stderr=log, env=env, start_new_session=True, text=stdout is not None
            )


class Werk(System):
    name = "werk"
    label = "werk serve (prompt cache at its default budget)"
    key = KEY

    def __init__(self, setup: Setup, extra: list[str], name: str = "werk", label: str = "") -> None:
        super().__init__(setup)
        self.extra = extra
        self.name = name
        self.label = label or self.label
        self.profile: Path | None = None

    def fresh_state(self) -> None:
        super().fresh_state()
        home = self.state / "home"
        home.mkdir(mode=0o700)
        registry = ModelRegistry(home)
        for model, path in self.setup.models.items():
            registry.add(ModelManifest.from_paths(WERK_MODELS[model], [path], backend="llama.cpp"))

    def use_alternation_profile(self) -> None:
        """Two instances, one per model, each stopped right after its request (one loaded at a time)."""
        self.profile = self.state / "alternate.toml"
        lines = []
        for model in ("A", "B"):
            lines += ["[[instance]]", f'id = "{WERK_MODELS[model]}"', f'model = "{WERK_MODELS[model]}"']
            lines += ['backend = "llama.cpp"', "keep_alive = 0", ""]
        self.profile.write_text("\n".join(lines))

    def start(self, model: str = "A") -> float:
        self.model = model
        env = {**os.environ, "WERK_HOME": str(self.state / "home"), "WERK_API_KEYS": KEY}
        env["WERK_LLAMA_SERVER"] = str(self.setup.server)
        cmd = [sys.executable, "-m", "werk_host", "serve", "--port", "0"]
        for option in (f"threads={self.setup.threads}", "parallel=2", f"ctx={2 * self.setup.slot_ctx}"):
            cmd += ["--backend-option", f"llamacpp.{option}"]
        cmd += [*self.extra, *(["--profile", str(self.profile)] if self.profile else ["--model", WERK_MODELS[model]])]
        start = time.perf_counter()
        self.proc = self.popen(cmd, env=env, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            raise BenchError(f"werk serve exited with code {self.proc.returncode} (see {self.setup.work}/werk.log)")
        self.port = json.loads(line)["port"]
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # never let stdout fill up
        return (time.perf_counter() - start) * 1000

    def request_model(self, model: str) -> str:
        return WERK_MODELS[model]

    def saved_files(self) -> list[Path]:
        home = self.state / "home"
        found = [p for p in home.rglob("*") if p.is_file() and not p.is_symlink() and p.stat().st_size > 1 << 20]
        return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)[:3]

    def metrics(self) -> list[str]:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/metrics")
        req.add_header("Authorization", f"Bearer {KEY}")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                text = resp.read().decode()
        except (OSError, urllib.error.HTTPError) as exc:
            return [f"(/metrics: {exc})"]
        return [line for line in text.splitlines() if "prompt_cache" in line and not line.startswith("#")]


class Hearth(System):
    name = "hearth"
    label = f"hearth-llm=={_peers.PEERS['hearth'][1]} (hearth serve, starts llama-server itself)"

    def __init__(self, setup: Setup, venv: Path) -> None:
        super().__init__(setup)
        self.venv = venv

    def start(self, model: str = "A") -> float:
        self.model = model
        self.port = free_port()
        cache = self.state / "cache"
        cmd = [str(self.venv / "bin" / "hearth"), "serve", "--model", str(self.setup.models[model])]
        cmd += ["--port", str(self.port), "--upstream-port", str(free_port()), "--ctx", str(self.setup.slot_ctx)]
        cmd += ["--cache-dir", str(cache), "--", "-t", str(self.setup.threads), "--no-warmup"]
        # hearth runs the llama-server on PATH: put the shared binary first.
        env = {**os.environ, "PATH": f"{self.setup.server.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        start = time.perf_counter()
        self.proc = self.popen(cmd, env=env)
        wait_http(self.port, "/health", self.proc, "hearth serve")
        return (time.perf_counter() - start) * 1000

    def saved_files(self) -> list[Path]:
        return sorted((self.state / "cache").glob("*.kv"), key=lambda p: p.stat().st_mtime, reverse=True)[:1]


class Stillwarm(System):
    name = "stillwarm"
    label = f"stillwarm=={_peers.PEERS['stillwarm'][1]} (Session behind bench/_peers.py's proxy)"

    def __init__(self, setup: Setup, venv: Path) -> None:
        super().__init__(setup)
        self.venv = venv

    def start(self, model: str = "A") -> float:
        self.model = model
        self.port = free_port()
        cmd = [str(self.venv / "bin" / "python"), str(Path(_peers.__file__).resolve()), "stillwarm-proxy"]
        cmd += ["--port", str(self.port), "--upstream-port", str(free_port())]
        cmd += ["--llama-server", str(self.setup.server), "--model", str(self.setup.models[model])]
        cmd += ["--model-sha256", SMOLLM2_SHA256, "--ctx", str(self.setup.slot_ctx)]
        cmd += ["--cache-dir", str(self.state / "cache"), "--log", str(self.setup.work / "stillwarm-llama.log")]
        cmd += ["--", "-t", str(self.setup.threads), "--no-warmup"]
        start = time.perf_counter()
        self.proc = self.popen(cmd)
        wait_http(self.port, "/health", self.proc, "stillwarm proxy")
        return (time.perf_counter() - start) * 1000

    def saved_files(self) -> list[Path]:
        return sorted((self.state / "cache").glob("conv-*.bin"), key=lambda p: p.stat().st_mtime, reverse=True)[:1]


class RawServer:
    """llama-server alone, with the systems' flags: tokenizing the document, and the raw slot restore.

    ``parallel`` must be the saving server's: a slot file records the KV layout (llama-server
    refuses a file from a 2-slot server in a 1-slot one: "n_stream mismatch")."""

    def __init__(self, setup: Setup, parallel: int = 1) -> None:
        self.setup = setup
        self.slots = setup.work / f"raw-slots-{parallel}"
        self.slots.mkdir(exist_ok=True)
        self.port = free_port()
        cmd = [str(setup.server), "-m", str(setup.models["A"]), "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--slot-save-path", str(self.slots), "--parallel", str(parallel), "-c", str(parallel * setup.slot_ctx)]
        cmd += ["-t", str(setup.threads), "--no-warmup"]
        self.cmd = cmd
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        with open(self.setup.work / "raw-llama.log", "ab") as log:
            proc = subprocess.Popen(self.cmd, stdout=log, stderr=log, start_new_session=True)
        wait_http(self.port, "/health", proc, "llama-server")
        return proc

    def revive(self) -> None:
        """Start it again if a bad file took it down (llama-server aborts on some)."""
        if self.proc.poll() is not None:
            self.proc = self._start()

    def document(self, n_tokens: int, seed: int) -> str:
        """English-like text of about ``n_tokens`` tokens from ``seed``, cut with the model's tokenizer."""
        rng = random.Random(seed)
        regions = ("north", "east", "south", "west", "harbour", "river")
        people = ("Ada Marsh", "Ben Okafor", "Chen Li", "Dara Quinn", "Eli Novak", "Fay Moreau")
        months = ("January", "March", "May", "July", "September", "November")
        sentences = []
        for i in range(n_tokens // 10 + 64):
            sentences.append(
                f"Section {i + 1}: in {rng.choice(months)} the {rng.choice(regions)} warehouse received shipment "
                f"{rng.randrange(100, 999)} with {rng.randrange(2, 90)} crates, {rng.randrange(0, 12)} of them "
                f"damaged, and {rng.choice(people)} signed the report for the committee."
            )
        ids = http_json(self.port, "POST", "/tokenize", {"content": " ".join(sentences), "add_special": False})
        text: str = http_json(self.port, "POST", "/detokenize", {"tokens": ids["tokens"][:n_tokens]})["content"]
        return text

    def restore(self, source: Path, messages: list[dict[str, str]], times: int = 5) -> dict[str, Any]:
        """Restore ``source`` into slot 0 ``times`` times, then ask: the raw figures."""
        name = "raw-restore.bin"
        shutil.copyfile(source, self.slots / name)
        walls, server_ms, restored = [], [], 0
        for _ in range(times):
            http_json(self.port, "POST", "/slots/0?action=erase", {})
            start = time.perf_counter()
            answer = http_json(self.port, "POST", "/slots/0?action=restore", {"filename": name})
            walls.append((time.perf_counter() - start) * 1000)
            server_ms.append(float(answer.get("timings", {}).get("restore_ms", 0)))
            restored = int(answer.get("n_restored", 0))
        reply = chat(self.port, "raw", messages)
        return {
            "file": source,
            "bytes": source.stat().st_size,
            "tokens": restored,
            "restore_ms": statistics.median(walls),
            "restore_server_ms": statistics.median(server_ms),
            "after_restore": reply,
        }

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- the measurements -----------------------------------------------------------------------------------------------


@dataclass
class Result:
    system: System
    cold: list[Reply] = field(default_factory=list)
    restart: list[Reply] = field(default_factory=list)
    ready_ms: list[float] = field(default_factory=list)
    turns: list[tuple[int, bool, Reply]] = field(default_factory=list)
    steps: list[tuple[str, float, Reply]] = field(default_factory=list)
    candidates: list[Path] = field(default_factory=list)
    metrics: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str = ""

    def ratio(self) -> float | None:
        if not self.cold or not self.restart:
            return None
        return med([r.ttft_ms for r in self.restart]) / med([r.ttft_ms for r in self.cold])


def metric_restore_ms(lines: list[str]) -> float | None:
    """Werk's own time per restore from ``/metrics``: ``_restore_ms_total`` over the restores,
    on a request's path (``_hits_total``) or by the warm start before it (``_prewarms_total``)."""
    values: dict[str, float] = {}
    for line in lines:
        name, _, value = line.rpartition(" ")
        try:
            values[name.split("{")[0]] = values.get(name.split("{")[0], 0.0) + float(value)
        except ValueError:
            continue
    hits = values.get("werk_chat_prompt_cache_hits_total", 0.0) + values.get(
        "werk_chat_prompt_cache_prewarms_total", 0.0
    )
    total = values.get("werk_chat_prompt_cache_restore_ms_total")
    return total / hits if hits and total is not None else None


def med(values: list[float]) -> float:
    return statistics.median(values)


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def prompt(document: str, question: str) -> list[dict[str, str]]:
    return [user(f"Read this document.\n\n{document}\n\nQuestion: {question}")]


def copy_candidates(files: list[Path], into: Path) -> list[Path]:
    into.mkdir(parents=True, exist_ok=True)
    out = []
    for i, path in enumerate(files):
        target = into / f"{i}-{path.name}"
        shutil.copyfile(path, target)
        out.append(target)
    return out


def measure(system: System, docs: dict[str, str], args: argparse.Namespace, full: bool) -> Result:
    res = Result(system)
    think = args.think
    first = prompt(docs["A"], QUESTIONS[0])

    def settle() -> None:
        quiesce(system.proc.pid if system.proc else None, minimum=think)

    try:
        # 1. cold, then the same request after a full restart, on fresh state each round
        for round_no in range(1, args.rounds + 1):
            system.fresh_state()
            res.ready_ms.append(system.start("A"))
            cold = system.ask(first)
            res.cold.append(cold)
            say(f"{system.name} round {round_no}: cold {cold.ttft_ms:.0f} ms [{cold.evidence()}]")
            settle()
            system.stop()
            res.ready_ms.append(system.start("A"))
            again = system.ask(first)
            res.restart.append(again)
            say(f"{system.name} round {round_no}: after restart {again.ttft_ms:.0f} ms [{again.evidence()}]")
            settle()  # saves after the answer finish before the files are copied
            if round_no == args.rounds:
                res.candidates = copy_candidates(system.saved_files(), system.setup.work / f"files-{system.name}")
            if isinstance(system, Werk):
                res.metrics += system.metrics()  # this process's counters: one restored request
            if round_no < args.rounds:
                system.stop()
        if not full:
            return res
        # 2. a 10-turn conversation across two full restarts
        messages = list(first)
        for turn in range(1, TURNS + 1):
            restarted = turn in RESTART_BEFORE
            if restarted:
                system.stop()
                system.start("A")
            reply = system.ask(messages)
            res.turns.append((turn, restarted, reply))
            mark = " (after restart)" if restarted else ""
            say(f"{system.name} turn {turn}{mark}: {reply.ttft_ms:.0f} ms [{reply.evidence()}]")
            messages += [{"role": "assistant", "content": reply.text}, user(QUESTIONS[turn % len(QUESTIONS)])]
            settle()
        system.stop()
        # 3. two models alternating on one slot
        chats = {m: prompt(docs[m], QUESTIONS[0]) for m in "AB"}
        asked = {"A": 0, "B": 0}
        if isinstance(system, Werk):
            system.use_alternation_profile()
            system.start("A")
        for step, model in enumerate(ALTERNATION, 1):
            swap_ms = 0.0
            if not isinstance(system, Werk):
                start = time.perf_counter()
                system.stop()
                system.start(model)
                swap_ms = (time.perf_counter() - start) * 1000
            reply = system.ask(chats[model], model)
            res.steps.append((model, swap_ms, reply))
            say(
                f"{system.name} step {step} (model {model}): swap {swap_ms:.0f} ms + first token {reply.ttft_ms:.0f} ms"
            )
            say(f"  [{reply.evidence()}]")
            asked[model] += 1
            chats[model] += [{"role": "assistant", "content": reply.text}, user(QUESTIONS[asked[model]])]
            settle()
    except (BenchError, OSError, ValueError, KeyError, subprocess.SubprocessError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"
        say(f"{system.name}: {res.error}")
    finally:
        system.stop()
    return res


# -- report ---------------------------------------------------------------------------------------------------------


def fmt(ms: float) -> str:
    return f"{ms:9.0f} ms" if ms >= 1000 else f"{ms:9.1f} ms"


def report(results: list[Result], raw: dict[str, Any] | None, raw_note: str, args: argparse.Namespace) -> None:
    print()
    print(f"== by system (first token, {ANSWER_TOKENS} answer tokens, {args.rounds} round(s)) ==")
    for res in results:
        sysm = res.system
        print(f"\n{sysm.name}: {sysm.label}")
        if res.error:
            print(f"  NOT MEASURED IN FULL: {res.error}")
        if res.ready_ms:
            print(f"  start until ready: {', '.join(f'{ms:.0f}' for ms in res.ready_ms)} ms")
        for i, (cold, again) in enumerate(zip(res.cold, res.restart, strict=False), 1):
            same = "yes" if again.text == cold.text else f"NO ({cold.text!r} vs {again.text!r})"
            print(
                f"  round {i}: cold {fmt(cold.ttft_ms)} | after full restart {fmt(again.ttft_ms)}"
                f" (whole answer {again.total_ms:.0f} ms) | answer equal: {same}"
            )
            print(f"           cold: {cold.evidence()}")
            print(f"           restart: {again.evidence()}")
        if res.cold:
            print(f"  cold answer: {res.cold[0].text!r}")
            replies = [*res.cold, *res.restart, *(x for _, _, x in res.turns), *(x for _, _, x in res.steps)]
            gap = med([x.total_ms - x.ttft_ms for x in replies])
            print(f"  first token to last (median of {len(replies)} answers): {gap:.1f} ms", end="")
            print(" - the stream arrives in one piece" if gap < 5 else "")
        for line in res.metrics:
            print(f"  /metrics {line}")
        if res.turns:
            cells = [f"{t}{'R' if r else ''}:{x.ttft_ms:.0f}" for t, r, x in res.turns]
            print(f"  conversation (turn:ms, R = first turn after a full restart): {' '.join(cells)}")
        if res.steps:
            cells = [f"{m}:{s:.0f}+{x.ttft_ms:.0f}" for m, s, x in res.steps]
            print(f"  alternation (model:swap ms+first token ms): {' '.join(cells)}")
            if isinstance(sysm, Werk):
                print("  (Werk: no single-slot swap setting; two instances with keep_alive = 0, so each stops")
                print("   after its request and the swap is inside the first token; peers: stop + start)")
        for note in res.notes:
            print(f"  {note}")

    print("\n== summary ==")
    print(f"  {'system':<14}{'cold':>13}{'after restart':>16}{'restart/cold':>14}  answers equal")
    for res in results:
        if not res.cold or not res.restart:
            print(f"  {res.system.name:<14}  not measured ({res.error or 'no rounds'})")
            continue
        cold, again = med([r.ttft_ms for r in res.cold]), med([r.ttft_ms for r in res.restart])
        equal = sum(a.text == c.text for c, a in zip(res.cold, res.restart, strict=False))
        print(
            f"  {res.system.name:<14}{fmt(cold):>13}{fmt(again):>16}{again / cold:>14.4f}  {equal}/{len(res.restart)}"
        )
    if raw:
        ar = raw["after_restore"]
        print(
            f"\n  raw llama-server: POST /slots/0?action=restore of {raw['file'].name} ({raw['bytes'] / 2**20:.1f} MiB,"
        )
        print(
            f"  {raw['tokens']} tokens): {raw['restore_ms']:.1f} ms (server's own {raw['restore_server_ms']:.1f} ms);"
        )
        print(f"  then the same request: first token {ar.ttft_ms:.1f} ms [{ar.evidence()}]")
    print(f"  {raw_note}" if raw_note else "", end="\n" if raw_note else "")

    by = {res.system.name: res for res in results}
    print()
    lines: list[tuple[str, float | None, str]] = []
    for res in results:
        lines.append((f"{res.system.name}_restart_vs_cold", res.ratio(), "info"))
    werk = by.get("werk")
    werk_ratio = werk.ratio() if werk else None
    if werk:
        lines[[n for n, _, _ in lines].index("werk_restart_vs_cold")] = (
            "werk_restart_vs_cold",
            werk_ratio,
            f"<= {TARGET_RESTART_VS_COLD}",
        )
    peer_ratios = [r for name in ("hearth", "stillwarm") if name in by and (r := by[name].ratio()) is not None]
    if werk:
        best = min(peer_ratios) if peer_ratios else None
        vs = werk_ratio / best if werk_ratio is not None and best else None
        lines.append(("werk_vs_best_peer", vs, f"<= {TARGET_VS_BEST_PEER}"))
        share = added = None
        per_hit = metric_restore_ms(werk.metrics)
        if raw and per_hit is not None:
            share = per_hit / raw["restore_ms"]
            print(
                f"  werk's restore share (verify + restore: /metrics _restore_ms_total / _hits_total): {per_hit:.1f} ms"
            )
        if raw and werk.restart:
            own = med([r.ttft_ms for r in werk.restart]) - raw["after_restore"].ttft_ms
            added = own / raw["restore_ms"]
            print(f"  all werk adds to the restored request, seen from outside: {own:.1f} ms (its first token after")
            print("  the restart minus llama-server's first token right after the raw restore)")
        lines.append(("werk_restore_share_vs_raw_slot_restore", share, f"<= {TARGET_SHARE_VS_RAW}"))
        lines.append(("werk_restored_request_overhead_vs_raw_slot_restore", added, "info"))
    for res in results:
        if res.turns and res.cold:
            after = [x.ttft_ms for _, r, x in res.turns if r]
            lines.append(
                (
                    f"{res.system.name}_conversation_after_restart_vs_cold",
                    med(after) / med([c.ttft_ms for c in res.cold]),
                    "info",
                )
            )
        if len(res.steps) > 2 and res.cold:
            later = [s + x.ttft_ms for _, s, x in res.steps[2:]]
            lines.append(
                (f"{res.system.name}_alternation_swap_vs_cold", med(later) / med([c.ttft_ms for c in res.cold]), "info")
            )
    print()
    for name, value, target in lines:
        shown = "n/a" if value is None else f"{value:.4f}"
        print(f"RATIO {name} = {shown} ({'no target' if target == 'info' else 'target ' + target})")


def raw_figures(setup: Setup, raw: RawServer, results: list[Result], first: list[dict[str, str]]) -> tuple[Any, str]:
    """llama-server's own restore of Werk's file (else a peer's file of the same prompt)."""
    tried = []
    for res in sorted(results, key=lambda r: r.system.name != "werk"):
        if res.system.name == "werk-nocache" or not res.candidates:
            continue
        # Werk's llama-server has 2 slots (its last one is the named-state slot); the peers' have 1.
        server = RawServer(setup, parallel=2) if isinstance(res.system, Werk) else raw
        try:
            for path in res.candidates:
                try:
                    figures = server.restore(path, first)
                except (urllib.error.HTTPError, OSError, BenchError) as exc:
                    server.revive()
                    tried.append(f"{res.system.name} {path.name}: {exc}")
                    continue
                note = "" if res.system.name == "werk" else f"(no Werk file restored raw; used {res.system.name}'s)"
                if tried:
                    note += f" (refused first: {'; '.join(tried)})"
                return figures, note
        finally:
            if server is not raw:
                server.close()
    return None, "raw slot restore: no saved file to restore" + (f" ({'; '.join(tried)})" if tried else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="cold/restart rounds, each on fresh state (default 3)")
    parser.add_argument("--quick", action="store_true", help="smoke run: a ~1,300-token document, 1 round")
    parser.add_argument("--only", choices=("werk", "hearth", "stillwarm"), help="measure one system")
    parser.add_argument("--tokens", type=int, help="document tokens (default 6000; 1300 with --quick)")
    parser.add_argument("--threads", type=int, default=1, help="llama-server -t for every system (default 1)")
    parser.add_argument("--think", type=float, default=1.0, help="seconds at least between requests (default 1)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, caches)")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 1
    # --quick stays above Werk's prompt-cache threshold (1,024 prompt tokens, docs/prompt-cache.md)
    tokens = args.tokens or (1300 if args.quick else 6000)
    slot_ctx = (tokens + 1536 + 255) // 256 * 256
    names = [args.only] if args.only else ["werk", "hearth", "stillwarm"]

    venvs = {name: _peers.ensure_peer(name) for name in names if name in _peers.PEERS}
    server = llama_server_binary()
    gguf = smollm2_gguf()
    work = Path(tempfile.mkdtemp(prefix="werk-bench-warm-"))
    setup = Setup(server, {"A": gguf, "B": second_model(gguf)}, slot_ctx, args.threads, work)
    say(f"work directory {work}")

    systems: list[tuple[System, bool]] = []
    baseline: list[tuple[System, bool]] = []
    skipped: list[str] = []
    if "werk" in names:
        systems.append((Werk(setup, []), True))
        serve_help = subprocess.run(
            [sys.executable, "-m", "werk_host", "serve", "--help"], capture_output=True, text=True, check=False
        ).stdout
        if "--prompt-cache-budget" in serve_help:
            off = Werk(setup, ["--prompt-cache-budget", "0"], "werk-nocache", "werk serve --prompt-cache-budget 0")
            baseline.append((off, False))  # measured last: the figures that have targets come first
        else:
            skipped.append("werk-nocache: skipped, `werk serve --help` lists no --prompt-cache-budget (not landed yet)")
    if "hearth" in names:
        systems.append((Hearth(setup, venvs["hearth"]), True))
    if "stillwarm" in names:
        systems.append((Stillwarm(setup, venvs["stillwarm"]), True))
    systems += baseline

    raw = RawServer(setup)
    try:
        docs = {"A": raw.document(tokens, SEED), "B": raw.document(tokens, SEED + 1)}
        first = prompt(docs["A"], QUESTIONS[0])
        doc_tokens = len(http_json(raw.port, "POST", "/tokenize", {"content": first[0]["content"]})["tokens"])
        print(f"warm_restart | {platform.node()} | {os.cpu_count()} CPUs | llama-server {server}")
        print(f"model SmolLM2-135M-Instruct Q4_1 ({gguf}); B = a copy under another name")
        print(
            f"document + question {doc_tokens} tokens (seed {SEED}) | threads {args.threads}"
            f" | per-request ctx {slot_ctx}"
        )
        print(f"answer {ANSWER_TOKENS} tokens, temperature 0, streamed /v1/chat/completions | rounds {args.rounds}")
        for name, venv in venvs.items():
            dist, version, _ = _peers.PEERS[name]
            print(f"peer {name}: {dist}=={version} in {venv}")
        for line in skipped:
            print(line)
        results = []
        for system, full in systems:
            say(f"== {system.name}: {system.label}")
            results.append(measure(system, docs, args, full))
            if not full:
                results[-1].notes.append("conversation and alternation: not run for this baseline")
        raw_result, raw_note = raw_figures(setup, raw, results, first)
    finally:
        raw.close()
    report(results, raw_result, raw_note, args)
    for line in skipped:
        print(line)
    if args.keep:
        print(f"work directory kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
