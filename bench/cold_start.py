"""Cold start: ``werk serve --model GGUF`` → first answer beside ``llama-server -m GGUF`` → first answer.

Both start from nothing (a new process, a fresh ``WERK_HOME`` for Werk) on the same real model
(SmolLM2-135M-Instruct Q4_1, :func:`werk_host.realmodel.smollm2_gguf`) and the same
``llama-server`` binary (``$WERK_LLAMA_SERVER``, else ``scripts/build-llama-server.sh``, cached).
The clock starts just before the process is spawned; the client then sends the same
non-streamed ``POST /v1/chat/completions`` (temperature 0, seed 42, ``max_tokens`` 8) again and
again, every 10 ms, until one is answered with 200: that moment is the figure. A request sent
to ``werk serve`` once its address is bound waits in the listen backlog until the host is
ready (docs/operations.md, "Start-up"); ``llama-server`` answers 503 while its model loads;
a refused connection (nothing bound yet) is retried the same way for both.

Figures (``--runs`` each, default 5, in alternating order: werk, llama-server, llama-server,
werk, ...; after one untimed warm-up run of each; the processes are stopped between runs):

* ``serve``: ``werk serve --model GGUF --port P`` vs ``llama-server -m GGUF --port P``: time
  to the first answered chat. Werk's run also records when it printed its ``listening`` line.
  ``werk serve`` runs twice per round: in the one home of all such runs, where the command
  started before (the warm-up run remembered its launch: docs/operations.md, "Remembered
  launches"), and in a new home of its own (a first start there). One ``RATIO`` line each;
  ``werk run`` likewise.
* ``run``: ``werk run GGUF "PROMPT" --max-tokens 8`` end to end (process start to exit: it
  starts the model, answers, stops it) vs a ``llama-server`` one-shot: start it, the first
  answered chat, SIGTERM and wait for its exit.

Werk runs with the same llama-server (``WERK_LLAMA_SERVER``) and its own default child
arguments (for SmolLM2: 2 slots of the trained 8,192-token context, no warm-up); the bare
llama-server with its defaults (4 slots sharing 8,192 tokens, a warm-up). ``--child-args``
adds, to the serve figure, llama-server started with werk's child arguments: what of the
difference is the child's configuration rather than the host. Medians, min and max; the last lines are
one ``RATIO name = X (target ...)`` per figure. The machine's other load makes single runs
noisy: read the medians.

    .venv/bin/python -m bench.cold_start [--runs 5] [--only serve|run] [--child-args] [--importtime]
        [--checkout DIR]

``--importtime`` adds one ``werk serve`` run under ``python -X importtime`` and prints the
slowest imports before the first child is spawned (the first answer is not timed then).

``--floor`` adds, to the serve figure, the floor of any Python host built from Werk's stack
(``bench/_floor_host.py``): it spawns llama-server with Werk's child arguments first thing,
imports the stack and builds a one-route falcon app while the child loads, and relays the chat
as it came. The serve ``RATIO`` line then prints that floor (÷ bare llama-server) beside its
target: the share of the figure no host of this design can remove on this machine.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._peers import bench_cache  # noqa: E402
from bench.warm_restart import free_port, llama_server_binary, quiesce  # noqa: E402
from werk_host.realmodel import smollm2_gguf  # noqa: E402

TARGET_SERVE = 1.3
ANSWER_TOKENS = 8
PROMPT = "Say hello in one short sentence."
POLL_S = 0.01
TIMEOUT_S = 300.0


class BenchError(RuntimeError):
    """A run failed; the message says why."""


def say(message: str) -> None:
    print(f"[cold_start] {message}", file=sys.stderr, flush=True)


def chat_body(model: str) -> bytes:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "temperature": 0,
        "seed": 42,
        "max_tokens": ANSWER_TOKENS,
    }
    return json.dumps(body).encode()


def first_answer(port: int, model: str, proc: subprocess.Popen[Any], what: str) -> str:
    """Send the chat until it is answered with 200 (refused connections and 503s are retried
    every :data:`POLL_S`); the answer's text."""
    body = chat_body(model)
    deadline = time.monotonic() + TIMEOUT_S
    last = "nothing"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"{what} exited with code {proc.returncode} before it answered ({last})")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
        try:
            conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            raw = resp.read()
            if resp.status == 200:
                text: str = json.loads(raw)["choices"][0]["message"]["content"]
                return text
            last = f"HTTP {resp.status}: {raw[:200]!r}"
            if resp.status not in (503,):
                raise BenchError(f"{what} answered {last}")
        except (ConnectionError, http.client.RemoteDisconnected, OSError) as exc:
            last = f"{type(exc).__name__}"
        finally:
            conn.close()
        time.sleep(POLL_S)
    raise BenchError(f"{what}: no answer after {TIMEOUT_S:.0f} s ({last})")


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def own_figures(pid: int) -> dict[str, float]:
    """What a running ``werk serve`` spent on its own: when (ms after its own start) it spawned
    its first child (the ``llama-server``), and its own CPU time so far (user + system, not
    counting its children): a figure the machine's other load disturbs far less than wall time."""
    tick = os.sysconf("SC_CLK_TCK")
    try:
        fields = _stat(pid)
        figures = {"cpu": (int(fields[11]) + int(fields[12])) * 1000 / tick}
        started = int(fields[19])
        children = [c for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]
        spawned = [int(_stat(int(child))[19]) for child in children]
    except (OSError, ValueError, IndexError):
        return {}
    if spawned:
        figures["spawned"] = (min(spawned) - started) * 1000 / tick
    return figures


#: What werk's child arguments say about where and as what it serves, left out when the bench
#: starts llama-server "with werk's child arguments" (its own port and model are given).
NOT_CARRIED = {"--host": 1, "--port": 1, "-m": 1, "--model": 1, "--slot-save-path": 1, "--alias": 1, "-a": 1}


def child_args(pid: int) -> list[str] | None:
    """The arguments of the ``llama-server`` a running ``werk serve`` spawned (its first child),
    less :data:`NOT_CARRIED`."""
    try:
        children = [c for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]
        argv = Path(f"/proc/{min(children, key=int)}/cmdline").read_bytes().split(b"\0")[:-1]
    except (OSError, ValueError):
        return None
    out: list[str] = []
    words = iter(arg.decode() for arg in argv[1:])
    for word in words:
        if word in NOT_CARRIED:
            next(words, None)
        else:
            out.append(word)
    return out


def stop(proc: subprocess.Popen[Any]) -> float:
    """SIGTERM and wait for the exit; ms it took."""
    start = time.perf_counter()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            say(f"pid {proc.pid} still running 60 s after SIGTERM; killing its process group")
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return (time.perf_counter() - start) * 1000


@dataclass
class Setup:
    server: Path
    gguf: Path
    work: Path
    runs: int = 0
    #: the arguments werk gave its llama-server (:func:`child_args`), once a werk serve ran
    werk_child_args: list[str] | None = None
    #: another checkout of this repository whose host and plugins ``werk`` runs from (a
    #: ``git archive`` of an earlier commit, for before/after figures); ``None``: the installed one
    checkout: Path | None = None

    def log(self, name: str) -> Any:
        return open(self.work / f"{name}.log", "ab")

    def popen(self, name: str, cmd: list[str], env: dict[str, str] | None = None, stdout: Any = None) -> Any:
        with self.log(name) as log:
            log.write(f"\n== {time.strftime('%H:%M:%S')} {' '.join(cmd)}\n".encode())
            log.flush()
            return subprocess.Popen(
                cmd, stdout=stdout or log, stderr=log, env=env, cwd=self.work, start_new_session=True
            )

    def werk_env(self, *, home: Path | None = None) -> dict[str, str]:
        """``werk``'s environment: ``home`` as ``WERK_HOME``, else a new home of its own."""
        if home is None:
            self.runs += 1
            home = self.work / f"home-{self.runs}"
            home.mkdir(mode=0o700)
        env = {**os.environ, "WERK_HOME": str(home), "WERK_LLAMA_SERVER": str(self.server)}
        # bytecode cached as an installed package has it (pip compiles on install), kept out of
        # the checkout: a PYTHONDONTWRITEBYTECODE environment would otherwise compile every
        # module of the host at every start
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(bench_cache() / "pycache")
        if self.checkout is not None:  # ahead of the editable installs (their entry points stay)
            paths = [self.checkout, *sorted(self.checkout.glob("plugins/*/src"))]
            env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
        return env


@dataclass
class Sample:
    ms: float
    detail: dict[str, float] = field(default_factory=dict)
    text: str = ""


def werk_serve(setup: Setup, *, home: Path | None = None) -> Sample:
    port = free_port()
    env = setup.werk_env(home=home)
    cmd = [sys.executable, "-m", "werk_host", "serve", "--port", str(port), "--model", str(setup.gguf)]
    start = time.perf_counter()
    proc = setup.popen("werk-serve", cmd, env=env, stdout=subprocess.PIPE)
    listening: list[float] = []

    def read_stdout() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if b'"listening"' in line and not listening:
                listening.append((time.perf_counter() - start) * 1000)

    reader = threading.Thread(target=read_stdout, daemon=True)
    reader.start()
    try:
        text = first_answer(port, setup.gguf.stem, proc, "werk serve")
        ms = (time.perf_counter() - start) * 1000
        detail = own_figures(proc.pid)
        if setup.werk_child_args is None:
            setup.werk_child_args = child_args(proc.pid)
    finally:
        stop(proc)
        reader.join(timeout=10)
    if listening:
        detail["listening"] = listening[0]
    return Sample(ms, detail, text)


def werk_serve_again(setup: Setup) -> Sample:
    """``werk serve`` in the one home of every such run: from the second on, a start of a command
    that started there before (its remembered launch; docs/operations.md, "Remembered launches")."""
    home = setup.work / "home-again"
    home.mkdir(mode=0o700, exist_ok=True)
    return werk_serve(setup, home=home)


def llama_serve(setup: Setup, *, then_stop: bool = False, extra: list[str] | None = None) -> Sample:
    port = free_port()
    cmd = [str(setup.server), "-m", str(setup.gguf), "--host", "127.0.0.1", "--port", str(port), *(extra or [])]
    start = time.perf_counter()
    proc = setup.popen("llama-server", cmd)
    try:
        text = first_answer(port, setup.gguf.stem, proc, "llama-server")
        ms = (time.perf_counter() - start) * 1000
    finally:
        stopped = stop(proc)
    detail = {"answered": ms}
    if then_stop:
        ms += stopped
        detail["stop"] = stopped
    return Sample(ms, detail, text)


def llama_serve_werk_args(setup: Setup) -> Sample:
    """``llama-server -m GGUF`` with the arguments werk gives its child (context, slots, no
    warm-up, ...): what of werk's figure is its child's configuration rather than the host."""
    if setup.werk_child_args is None:
        raise BenchError("werk's child arguments are not known (no werk serve run read them)")
    return llama_serve(setup, extra=setup.werk_child_args)


def floor_serve(setup: Setup) -> Sample:
    """:mod:`bench._floor_host` → first answer (module docstring, ``--floor``)."""
    if setup.werk_child_args is None:
        raise BenchError("werk's child arguments are not known (no werk serve run read them)")
    port, child_port = free_port(), free_port()
    host = Path(__file__).with_name("_floor_host.py")
    cmd = [sys.executable, str(host), str(port), str(child_port), str(setup.server), str(setup.gguf)]
    env = setup.werk_env()
    start = time.perf_counter()
    proc = setup.popen("floor", [*cmd, *setup.werk_child_args], env=env)
    try:
        text = first_answer(port, setup.gguf.stem, proc, "the floor host")
        ms = (time.perf_counter() - start) * 1000
    finally:
        stop(proc)
    return Sample(ms, {}, text)


def werk_run(setup: Setup, *, home: Path | None = None) -> Sample:
    env = setup.werk_env(home=home)
    cmd = [sys.executable, "-m", "werk_host", "run", str(setup.gguf), PROMPT, "--max-tokens", str(ANSWER_TOKENS)]
    cmd += ["--temperature", "0", "--seed", "42"]
    start = time.perf_counter()
    proc = setup.popen("werk-run", cmd, env=env, stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=TIMEOUT_S)
    ms = (time.perf_counter() - start) * 1000
    if proc.returncode != 0:
        raise BenchError(f"werk run exited with code {proc.returncode} (see {setup.work}/werk-run.log)")
    return Sample(ms, {}, out.decode().strip())


def werk_run_again(setup: Setup) -> Sample:
    """``werk run`` in the one home of every such run (a remembered launch, as :func:`werk_serve_again`)."""
    home = setup.work / "home-run-again"
    home.mkdir(mode=0o700, exist_ok=True)
    return werk_run(setup, home=home)


def llama_one_shot(setup: Setup) -> Sample:
    return llama_serve(setup, then_stop=True)


def alternate(setup: Setup, runs: int, systems: list[tuple[str, Callable[[Setup], Sample]]]) -> list[list[Sample]]:
    """``runs`` samples of each system, in the order 1 2 3, 3 2 1, 1 2 3, ... (the processes
    stopped between runs), after one untimed run of each (bytecode written, the model file in
    the page cache)."""
    for name, measure in systems:
        measure(setup)
        say(f"{name}: warm-up run done")
    got: list[list[Sample]] = [[] for _ in systems]
    for i in range(runs):
        order = list(range(len(systems)))
        for which in order if i % 2 == 0 else reversed(order):
            quiesce(None, minimum=0.5)
            name, measure = systems[which]
            sample = measure(setup)
            got[which].append(sample)
            extra = "".join(f", {k} {v:.0f} ms" for k, v in sample.detail.items())
            say(f"{name} run {i + 1}: {sample.ms:.0f} ms{extra}")
    return got


def summary(name: str, samples: list[Sample]) -> str:
    values = [s.ms for s in samples]
    line = f"  {name:<34} median {statistics.median(values):7.0f} ms   min {min(values):7.0f}   max {max(values):7.0f}"
    keys = sorted({k for s in samples for k in s.detail})
    for key in keys:
        inner = [s.detail[key] for s in samples if key in s.detail]
        line += f"   ({key} median {statistics.median(inner):.0f} ms)"
    return line


def import_profile(setup: Setup, top: int = 15) -> list[str]:
    """One ``werk serve`` under ``-X importtime``: the slowest cumulative imports (top level
    and their largest children) until its first answer."""
    port = free_port()
    env = setup.werk_env()
    cmd = [sys.executable, "-X", "importtime", "-m", "werk_host", "serve", "--port", str(port)]
    cmd += ["--model", str(setup.gguf)]
    err = setup.work / "importtime.txt"
    with open(err, "wb") as stderr:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=stderr, env=env, cwd=setup.work, start_new_session=True
        )
    try:
        first_answer(port, setup.gguf.stem, proc, "werk serve -X importtime")
    finally:
        stop(proc)
    rows: list[tuple[int, int, str]] = []
    for line in err.read_text().splitlines():
        parts = line.removeprefix("import time:").split("|")
        if not line.startswith("import time:") or len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        name = parts[2].rstrip()
        depth = (len(name) - len(name.lstrip()) - 1) // 2
        rows.append((int(parts[1]), depth, name.strip()))
    top_level = [r for r in rows if r[1] == min(d for _, d, _ in rows)]
    total = sum(us for us, _, _ in top_level)
    rows = [r for r in rows if r[1] <= top_level[0][1] + 1]
    rows.sort(reverse=True)
    lines = [f"  all imports: {total / 1000:.0f} ms (under -X importtime, which inflates them)"]
    lines += [f"  {us / 1000:7.1f} ms  {'  ' * depth}{name}" for us, depth, name in rows[:top]]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="runs of each system per figure (default 5)")
    parser.add_argument("--only", choices=("serve", "run"), help="measure one figure")
    parser.add_argument("--importtime", action="store_true", help="also one werk serve under -X importtime")
    parser.add_argument(
        "--child-args",
        action="store_true",
        help="serve figure: also llama-server with the arguments werk gives its child (informational)",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="serve figure: also the floor of a Python host of this stack (bench/_floor_host.py)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory (homes, logs)")
    parser.add_argument(
        "--checkout",
        type=Path,
        metavar="DIR",
        help="run werk from this copy of the repository (e.g. git archive REV | tar -x -C DIR) instead of the "
        "installed one: before/after figures",
    )
    args = parser.parse_args()
    server = llama_server_binary()
    gguf = smollm2_gguf()
    work = Path(tempfile.mkdtemp(prefix="werk-bench-cold-"))
    setup = Setup(server, gguf, work, checkout=args.checkout.resolve() if args.checkout else None)
    say(f"work directory {work}")
    print(f"cold_start | {platform.node()} | {os.cpu_count()} CPUs | load {os.getloadavg()[0]:.2f}")
    print(f"llama-server {server}")
    print(f"werk from {setup.checkout or 'the installed host'} ({sys.executable})")
    print(f"model SmolLM2-135M-Instruct Q4_1 ({gguf})")
    print(f"chat: non-streamed, {ANSWER_TOKENS} answer tokens, temperature 0 | runs {args.runs} each, alternating")
    ratios: list[tuple[str, float, str]] = []
    try:
        if args.only in (None, "serve"):
            systems: list[tuple[str, Callable[[Setup], Sample]]] = [
                ("werk serve", werk_serve_again),
                ("llama-server", llama_serve),
                ("werk serve in a new home", werk_serve),
            ]
            if args.child_args:
                systems.append(("llama-server with werk's child arguments", llama_serve_werk_args))
            if args.floor:
                systems.append(("the floor host", floor_serve))
            got = alternate(setup, args.runs, systems)
            werk, llama, new_home = got[0], got[1], got[2]
            print("\nstart → first answered chat:")
            print(summary("werk serve --model GGUF", werk))
            print(summary("llama-server -m GGUF", llama))
            print(summary("werk serve, in a new home", new_home))
            if args.child_args:
                print(summary("llama-server -m GGUF + werk's args", got[3]))
                print(f"  werk's child arguments: {' '.join(setup.werk_child_args or [])}")
            llama_ms = statistics.median(s.ms for s in llama)
            target = f"target <= {TARGET_SERVE}"
            if args.floor:
                floor = got[-1]
                print(summary("the floor host (bench/_floor_host.py)", floor))
                floor_ratio = statistics.median(s.ms for s in floor) / llama_ms
                target += f"; floor {floor_ratio:.4f}: a Python host of this stack spawning werk's child first"
                ratios.append(("serve_floor_host_vs_llama_server", floor_ratio, "no target: the floor"))
            ratio = statistics.median(s.ms for s in werk) / llama_ms
            ratios.append(("serve_first_answer_vs_llama_server", ratio, target))
            ratio = statistics.median(s.ms for s in new_home) / llama_ms
            ratios.append(("serve_first_answer_in_a_new_home_vs_llama_server", ratio, f"target <= {TARGET_SERVE}"))
            if args.child_args:
                ratio = statistics.median(s.ms for s in werk) / statistics.median(s.ms for s in got[3])
                ratios.append(("serve_first_answer_vs_llama_server_with_werks_child_args", ratio, "no target"))
        if args.only in (None, "run"):
            runs: list[tuple[str, Callable[[Setup], Sample]]] = [
                ("werk run", werk_run_again),
                ("llama-server one-shot", llama_one_shot),
                ("werk run in a new home", werk_run),
            ]
            werk, llama, new_home = alternate(setup, args.runs, runs)
            print("\none answer end to end (start, answer, stop):")
            print(summary("werk run GGUF PROMPT", werk))
            print(summary("llama-server one-shot", llama))
            print(summary("werk run, in a new home", new_home))
            print(f"  werk run answered: {werk[0].text!r}")
            llama_ms = statistics.median(s.ms for s in llama)
            ratio = statistics.median(s.ms for s in werk) / llama_ms
            ratios.append(("run_end_to_end_vs_llama_server_one_shot", ratio, "no target"))
            ratio = statistics.median(s.ms for s in new_home) / llama_ms
            ratios.append(("run_end_to_end_in_a_new_home_vs_llama_server_one_shot", ratio, "no target"))
        if args.importtime:
            print("\nwerk serve imports (one run under -X importtime):")
            for line in import_profile(setup):
                print(line)
    finally:
        if args.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print()
    for name, value, target in ratios:
        print(f"RATIO {name} = {value:.4f} ({target})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
