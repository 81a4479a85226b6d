"""Crash run: SIGKILL ``werk serve`` and the store's writers mid-commit, then audit the store.

Two kinds of victims, ``--kills`` (default 1,000) in total:

* ``werk serve`` (``--serve-kills``, default 100): a real ``python -m werk_host serve`` with
  the llama.cpp backend and a generated tiny GGUF model. Client threads send disk-mode
  prefills over HTTP (reuse disabled, so every answer commits a snapshot to the store);
  every 200 answer's ``state_id`` is acknowledged. At a random moment after the first
  acknowledgement the server is SIGKILLed and every child it had (llama-server, guards)
  is killed too; then the store under ``WERK_HOME`` is audited directly
  (``StateStore(home/"runtime-state"/"v1")``), and the next round's restarted server
  must list every acknowledged state over HTTP.
* store writer processes (the rest): ``tests/store/crashkit.py`` forks writers that
  commit deterministic payloads in a loop and kills them 5-60 ms in.

Audit after every kill: every acknowledged state is listed and its payload verifies
(SHA-256 and size; the writers' states also byte for byte); a listed state that was
never acknowledged (killed between publish and answer) must verify too. Periodic
reconciliations must leave no staging entry, temporary file or quarantined state.

Figures: ``mid_commit`` counts kills that landed inside a commit (a new staging entry
was left behind, or a state was published whose acknowledgement never got out),
``acked`` the acknowledged commits, ``lost`` acknowledged commits not listed or not
intact, ``corrupt_visible`` listed states that fail verification or had to be
quarantined. The last line is::

    RESULT crash_run kills=1000 mid_commit=N acked=M lost=0 corrupt_visible=0

and the exit status is 1 when anything was lost, corrupt or left unclean.

    .venv/bin/python bench/crash_run.py [--kills 1000] [--serve-kills 100] [--seed 1] [--keep]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psutil  # type: ignore[import-untyped]  # noqa: E402

from tests.store.crashkit import StoreCrashStats, all_ids, run_store_kills, unclean_entries  # noqa: E402
from tests.store.helpers import P1, staging_leftovers  # noqa: E402
from werk_host.errors import WerkError  # noqa: E402
from werk_host.models import ModelManifest, ModelRegistry  # noqa: E402
from werk_host.store import StateStore  # noqa: E402

KEY = "sk-werk-crash-run-0123456789"
MODEL = "tiny"
#: Client threads sending prefills to one server.
CLIENTS = 2
#: Seconds after the first acknowledgement within which the kill lands (uniformly).
KILL_WINDOW = 0.6
STARTUP_TIMEOUT = 60.0


@dataclass
class ServeStats:
    """Figures of the ``werk serve`` rounds; ``lost``, ``corrupt`` and ``unclean`` must stay empty."""

    kills: int = 0
    mid_commit: int = 0
    acked: int = 0
    torn_publish: int = 0
    #: Children of a killed server still alive a second after it died (then killed here).
    orphans: int = 0
    #: Non-200 answers from a live server (they are not acknowledgements).
    refused: int = 0
    lost: set[str] = field(default_factory=set)
    corrupt: set[str] = field(default_factory=set)
    unclean: set[str] = field(default_factory=set)
    seconds: float = 0.0


def payload_ok(store: StateStore, principal: str, sid: str) -> bool:
    """Whether ``sid`` is listed and its payload passes the store's size and SHA-256 check."""
    if store.get(principal, sid) is None:
        return False
    try:
        with store.open_payload(principal, sid) as f:
            while f.read(1 << 20):
                pass
    except WerkError:
        return False
    return True


def audit(store: StateStore, principal: str, acked: set[str], check: set[str]) -> tuple[set[str], set[str], set[str]]:
    """Audit one catalog: (lost, corrupt, visible).

    ``lost``: acknowledged ids not listed, or listed but failing verification. ``corrupt``:
    ids among ``check`` (plus every listed id that was never acknowledged) that are listed
    but fail verification. ``visible``: every listed id.
    """
    visible = set(all_ids(store, principal))
    corrupt = {s for s in (check | (visible - acked)) & visible if not payload_ok(store, principal, s)}
    lost = (acked - visible) | (acked & corrupt)
    return lost, corrupt, visible


def _http(port: int, method: str, path: str, body: Any = None, timeout: float = 30.0) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Authorization": f"Bearer {KEY}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


class Clients:
    """Threads that send disk-mode prefills until the server goes away."""

    def __init__(self, port: int, tag: str) -> None:
        self.port = port
        self.tag = tag
        self.acked: list[str] = []
        self.refused = 0
        self.first_ack = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(CLIENTS)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def join(self) -> None:
        for t in self._threads:
            t.join(timeout=60)

    def _run(self, worker: int) -> None:
        rng = random.Random(f"{self.tag}-{worker}")
        n = 0
        while True:
            n += 1
            words = " ".join(f"w{rng.randrange(10_000)}" for _ in range(rng.randint(8, 120)))
            body = {
                "model_id": MODEL,
                "input": {"type": "text", "text": f"{self.tag} {worker} {n}: {words}"},
                "policy": {"mode": "disk", "reuse": "disabled"},
                "allow_experimental": True,
            }
            try:
                status, answer = _http(self.port, "POST", "/werk/v1/prefill", body)
            except (OSError, http.client.HTTPException, ValueError):
                return  # the server is gone; an unanswered request was never acknowledged
            with self._lock:
                if status == 200:
                    self.acked.append(answer["data"]["state_id"])
                    self.first_ack.set()
                else:
                    self.refused += 1
            if status != 200:
                time.sleep(0.05)


class ServeRig:
    """Owns the WERK_HOME, the model and the ``werk serve`` rounds."""

    def __init__(self, work: Path, server_binary: Path, rng: random.Random) -> None:
        from werk_llamacpp.testing.testmodel import generate_model

        self.work = work
        self.rng = rng
        self.home = work / "serve-home"
        self.home.mkdir()
        self.root = self.home / "runtime-state" / "v1"
        model = generate_model(work / "tiny.gguf")
        ModelRegistry(self.home).add(ModelManifest.from_paths(MODEL, [model], backend="llama.cpp"))
        self.env = {
            **os.environ,
            "WERK_HOME": str(self.home),
            "WERK_API_KEYS": KEY,
            "WERK_LLAMA_SERVER": str(server_binary),
        }
        self.env.pop("WERK_LLAMA_ARGS", None)
        self.acked: set[str] = set()
        self.principal: str | None = None
        self.stats = ServeStats()

    def _start(self, round_no: int) -> tuple[subprocess.Popen[bytes], int]:
        with open(self.work / "serve.log", "ab") as log:  # the child keeps its own descriptor
            proc = subprocess.Popen(
                [sys.executable, "-m", "werk_host", "serve", "--port", "0", "--model", MODEL, "--log-level", "warning"]
                + ["--store-max-states", "1000000", "--store-max-states-per-key", "1000000"],  # one key, every round
                stdout=subprocess.PIPE,
                stderr=log,
                env=self.env,
                cwd=ROOT,
            )
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], STARTUP_TIMEOUT)
        line = proc.stdout.readline() if ready else b""
        if not line:
            self._kill(proc)
            raise RuntimeError(f"werk serve did not start in round {round_no} (see {self.work / 'serve.log'})")
        return proc, int(json.loads(line)["port"])

    def _kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL the server; then make sure none of its children (or any process using
        this run's files) outlives it, whatever their own parent-death handling does."""
        try:
            children = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        _gone, alive = psutil.wait_procs(children, timeout=1.0)
        marker = str(self.work)
        for p in psutil.process_iter(["pid", "cmdline"]):
            cmd = p.info["cmdline"] or []
            if p.pid != os.getpid() and p not in alive and any(marker in a for a in cmd):
                alive.append(p)
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        self.stats.orphans += len(alive)
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                continue
        _gone, still = psutil.wait_procs(alive, timeout=10)
        if [p for p in still if p.status() != psutil.STATUS_ZOMBIE]:
            raise RuntimeError(f"could not stop children {[p.pid for p in still]}")

    def _http_listed(self, port: int) -> set[str]:
        ids: set[str] = set()
        cursor: str | None = None
        while True:
            path = "/werk/v1/states?limit=100" + (f"&cursor={cursor}" if cursor else "")
            status, body = _http(port, "GET", path)
            if status != 200:
                raise RuntimeError(f"listing after restart failed: {status} {body}")
            ids |= {s["id"] for s in body["data"]["states"]}
            cursor = body["data"]["next_cursor"]
            if not cursor:
                return ids

    def round(self, round_no: int) -> None:
        staging_before = set(staging_leftovers(self.root))
        proc, port = self._start(round_no)
        clients = Clients(port, f"r{round_no}")
        try:
            if self.acked:  # the restarted server lists every state acknowledged before
                self.stats.lost |= self.acked - self._http_listed(port)
            clients.start()
            if not clients.first_ack.wait(STARTUP_TIMEOUT):
                raise RuntimeError(f"no prefill was acknowledged in round {round_no} (see {self.work / 'serve.log'})")
            time.sleep(self.rng.uniform(0.0, KILL_WINDOW))
        finally:
            self._kill(proc)
            clients.join()
        self.stats.kills += 1
        new = set(clients.acked)
        self.stats.acked += len(new)
        self.stats.refused += clients.refused
        self.acked |= new
        if self.principal is None:
            (pdir,) = [p for p in self.root.iterdir() if p.name.startswith("p_")]
            self.principal = pdir.name[2:]
        store = StateStore(self.root)
        check = set(self.acked) if round_no % 10 == 9 else new
        lost, corrupt, visible = audit(store, self.principal, self.acked, check)
        self.stats.lost |= lost
        self.stats.corrupt |= corrupt
        torn = visible - self.acked - corrupt
        if set(staging_leftovers(self.root)) - staging_before or torn:
            self.stats.mid_commit += 1
        self.stats.torn_publish += len(torn)
        self.acked |= torn  # published and intact: from now on it must stay
        if round_no % 3 == 2:
            store.reconcile()
            self.stats.unclean |= unclean_entries(self.root, self.principal)

    def finish(self) -> None:
        if self.principal is None:
            return
        store = StateStore(self.root)
        store.reconcile(full=True)
        self.stats.unclean |= unclean_entries(self.root, self.principal)
        lost, corrupt, _visible = audit(store, self.principal, self.acked, set(self.acked))
        self.stats.lost |= lost
        self.stats.corrupt |= corrupt


def run_serve(work: Path, kills: int, rng: random.Random) -> ServeStats:
    from werk_llamacpp.binary import find_llama_server

    rig = ServeRig(work, find_llama_server(use_path=False), rng)
    started = time.monotonic()
    for i in range(kills):
        rig.round(i)
        if (i + 1) % 10 == 0:
            s = rig.stats
            print(f"  serve: {s.kills} kills, {s.acked} acked, {s.mid_commit} mid-commit", flush=True)
    rig.finish()
    rig.stats.seconds = time.monotonic() - started
    return rig.stats


def run_store(work: Path, kills: int, rng: random.Random) -> StoreCrashStats:
    ackdir = work / "store-acks"
    ackdir.mkdir()
    return run_store_kills(work / "store-home" / "runtime-state" / "v1", P1, kills, rng, ackdir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=1000, help="SIGKILLs in total (default 1000)")
    parser.add_argument("--serve-kills", type=int, default=100, help="of which werk serve kills (default 100)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    if not 0 <= args.serve_kills <= args.kills:
        parser.error("--serve-kills must be between 0 and --kills")
    if args.serve_kills:
        from werk_llamacpp.binary import LlamaServerNotFound, find_llama_server

        try:
            find_llama_server(use_path=False)
        except LlamaServerNotFound as exc:
            print(f"crash_run: werk serve rounds need llama-server: {exc}", file=sys.stderr)
            return 2

    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="werk-crash-run-"))
    started = time.monotonic()
    try:
        serve = run_serve(work, args.serve_kills, rng) if args.serve_kills else ServeStats()
        store = run_store(work, args.kills - args.serve_kills, rng)
    finally:
        if args.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    elapsed = time.monotonic() - started

    print(
        f"werk serve: kills={serve.kills} mid_commit={serve.mid_commit} acked={serve.acked} "
        f"torn_publish={serve.torn_publish} refused={serve.refused} orphans_killed={serve.orphans} "
        f"lost={len(serve.lost)} corrupt_visible={len(serve.corrupt)} unclean={len(serve.unclean)} "
        f"seconds={serve.seconds:.1f}"
    )
    print(
        f"store writers: kills={store.kills} mid_commit={store.mid_commit} acked={store.acked} "
        f"torn_publish={store.torn_publish} live={store.live} lost={len(store.lost)} "
        f"corrupt_visible={len(store.corrupt)} unclean={len(store.unclean)} seconds={store.seconds:.1f}"
    )
    for label, ids in (
        ("lost", serve.lost | store.lost),
        ("corrupt", serve.corrupt | store.corrupt),
        ("unclean", serve.unclean | store.unclean),
    ):
        if ids:
            print(f"  {label}: {', '.join(sorted(ids)[:5])}{' ...' if len(ids) > 5 else ''}")
    lost = len(serve.lost) + len(store.lost)
    corrupt = len(serve.corrupt) + len(store.corrupt)
    unclean = len(serve.unclean) + len(store.unclean)
    print(f"wall time {elapsed:.1f}s")
    print(
        f"RESULT crash_run kills={serve.kills + store.kills} mid_commit={serve.mid_commit + store.mid_commit} "
        f"acked={serve.acked + store.acked} lost={lost} corrupt_visible={corrupt}"
    )
    return 1 if lost or corrupt or unclean else 0


if __name__ == "__main__":
    sys.exit(main())
