"""Images through Werk vs the pipeline called directly, jobs vs the synchronous route, the
pipeline's load, and the worker's memory over many requests (docs/media.md, "Benchmark").

The tiny random-weight Stable Diffusion pipeline (``werk_diffusers.testing.tiny_pipeline``),
64 x 64, 8 steps, ``Euler a``, fixed seeds, torch on ``--threads`` CPU threads on both sides.
Measured side by side in one run:

* **direct**: the worker's own generation function (``worker.py``'s ``load_pipeline`` and
  ``generate``) in a process of the same engine interpreter, the pipeline loaded once, each
  image timed after ``--warmup`` untimed ones;
* **txt2img**: ``POST /sdapi/v1/txt2img`` on a real ``werk serve`` with the ``diffusers``
  backend (the model registered with ``werk models add``), warm, the same request;
* **job**: ``POST /werk/v1/jobs`` then ``GET /werk/v1/jobs/{id}`` every ``--poll-ms`` until it
  succeeded, then ``GET .../result/image-0.png``; against the synchronous route;
* **load**: the first request on a freshly started host (the worker spawned, the pipeline
  loaded) against the second;
* **memory**: the worker's resident set (its process group) after 1 request and after 20.

Targets: ``RATIO txt2img_vs_direct`` <= 1.10; the job's added time p50 <= 50 ms; the memory
growth <= 5 %; the load ratio is printed::

    WERK_DIFFUSERS_PYTHON=$(bash scripts/setup-engine-venv.sh diffusers | tail -n1) \\
        .venv/bin/python bench/media.py [--runs 15] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
from werk_diffusers.testing import ENV, WORKER, tiny_pipeline  # noqa: E402

from werk_host.testing.api import Api  # noqa: E402
from werk_host.testing.hosts import serve_process  # noqa: E402

KEY = "sk-werk-bench-media"
MODEL = "tiny-sd"
SIZE, STEPS, SEED, SAMPLER = 64, 8, 1234, "Euler a"

DIRECT = """
import importlib, importlib.util, json, sys, time
spec = importlib.util.spec_from_file_location("werk_diffusers_worker", sys.argv[1])
worker = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = worker
spec.loader.exec_module(worker)
torch = importlib.import_module("torch")
diffusers = importlib.import_module("diffusers")
diffusers.utils.logging.disable_progress_bar()
torch.set_num_threads(int(sys.argv[3]))
body = json.loads(sys.argv[4])
loaded = worker.load_pipeline(torch, diffusers, sys.argv[2], "cpu")
times = []
for i in range(int(sys.argv[5]) + int(sys.argv[6])):
    began = time.perf_counter()
    worker.generate(torch, diffusers, loaded, body, lambda k, n: None, lambda: False)
    if i >= int(sys.argv[6]):
        times.append(time.perf_counter() - began)
print(json.dumps(times))
"""


def _body() -> dict[str, Any]:
    return {
        "mode": "txt2img",
        "prompt": "a lighthouse at dusk",
        "negative_prompt": "",
        "width": SIZE,
        "height": SIZE,
        "steps": STEPS,
        "guidance_scale": 7.0,
        "seed": SEED,
        "sampler": SAMPLER,
        "n": 1,
        "init_image": None,
        "strength": 0.75,
    }


def _direct(python: str, model: Path, threads: int, runs: int, warmup: int) -> list[float]:
    args = [python, "-c", DIRECT, str(WORKER), str(model), str(threads), json.dumps(_body()), str(runs), str(warmup)]
    done = subprocess.run(args, capture_output=True, text=True, check=True, env={**os.environ, **ENV}, timeout=1800)
    times: list[float] = json.loads(done.stdout.strip().splitlines()[-1])
    return times


def _txt2img(api: Api) -> float:
    body = {"prompt": "a lighthouse at dusk", "width": SIZE, "height": SIZE, "steps": STEPS, "seed": SEED}
    body |= {"sampler_name": SAMPLER, "cfg_scale": 7.0}
    began = time.perf_counter()
    status, doc = api.post("/sdapi/v1/txt2img", body)
    elapsed = time.perf_counter() - began
    assert status == 200 and len(doc["images"]) == 1, doc
    return elapsed


def _job(api: Api, poll_s: float) -> float:
    fields = {"prompt": "a lighthouse at dusk", "width": SIZE, "height": SIZE, "steps": STEPS, "seed": SEED}
    began = time.perf_counter()
    status, doc = api.post("/werk/v1/jobs", {"kind": "image", "model": MODEL, "input": {**fields, "sampler": SAMPLER}})
    assert status == 202, doc
    job_id = doc["data"]["id"]
    while (view := api.get(f"/werk/v1/jobs/{job_id}")[1]["data"])["status"] in ("queued", "running"):
        time.sleep(poll_s)
    assert view["status"] == "succeeded", view
    request = urllib.request.Request(
        f"{api.base}/werk/v1/jobs/{job_id}/result/image-0.png", headers={"Authorization": f"Bearer {KEY}"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        answer.read()
    return time.perf_counter() - began


def _worker_rss(api: Api) -> int:
    workers = api.get("/werk/v1/observability")[1]["data"]["workers"]
    (pid,) = {w["pid"] for w in workers if w["backend"] == "diffusers"}
    group = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [group, *group.children(recursive=True)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--poll-ms", type=float, default=5.0)
    args = parser.parse_args()
    python = os.environ.get("WERK_DIFFUSERS_PYTHON")
    if not python:
        print("set WERK_DIFFUSERS_PYTHON (bash scripts/setup-engine-venv.sh diffusers | tail -n1)", file=sys.stderr)
        return 2
    model = tiny_pipeline(python)
    with tempfile.TemporaryDirectory(prefix="werk-bench-media-") as scratch:
        home = Path(scratch) / "home"
        home.mkdir()
        env = {"WERK_DIFFUSERS_PYTHON": python}
        subprocess.run(
            [sys.executable, "-m", "werk_host", "models", "add", MODEL, str(model)],
            check=True,
            capture_output=True,
            env={**os.environ, **env, "WERK_HOME": str(home)},
        )
        serve_args = ("--model", MODEL, "--backend-option", f"diffusers.threads={args.threads}")
        with serve_process(home, *serve_args, keys=(KEY,), env=env) as served:
            api = Api(served.url, KEY, timeout=600)
            first = _txt2img(api)
            rss_one = _worker_rss(api)
            second = _txt2img(api)
            for _ in range(args.warmup):
                _txt2img(api)
            # alternate the routes so that drift in the machine's speed hits both alike
            sync: list[float] = []
            jobs: list[float] = []
            for _ in range(args.runs):
                sync.append(_txt2img(api))
                jobs.append(_job(api, args.poll_ms / 1000))
            served_count = 2 + args.warmup + 2 * args.runs
            for _ in range(max(0, 20 - served_count)):
                _txt2img(api)
            rss_many = _worker_rss(api)
            requests = max(20, served_count)
        direct = _direct(python, model, args.threads, args.runs, args.warmup)
    p50 = statistics.median
    print(f"direct (the pipeline in the engine interpreter): p50 {p50(direct) * 1000:.1f} ms over {len(direct)} images")
    print(f"/sdapi/v1/txt2img (warm):                       p50 {p50(sync) * 1000:.1f} ms over {len(sync)} images")
    print(f"job, submitted and polled every {args.poll_ms:g} ms:        p50 {p50(jobs) * 1000:.1f} ms")
    print(f"first request (worker start and pipeline load): {first * 1000:.0f} ms; second: {second * 1000:.0f} ms")
    print(f"worker RSS after 1 request: {rss_one / 2**20:.1f} MiB; after {requests}: {rss_many / 2**20:.1f} MiB")
    print(f"RATIO txt2img_vs_direct = {p50(sync) / p50(direct):.3f} (target <= 1.10)")
    print(f"RATIO job_added_ms = {(p50(jobs) - p50(sync)) * 1000:.1f} (target <= 50 ms p50)")
    print(f"RATIO first_vs_second = {first / second:.2f} (printed: the pipeline's load)")
    print(f"RATIO memory_growth = {rss_many / rss_one:.3f} (target <= 1.05)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
