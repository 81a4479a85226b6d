"""How large a JSON schema llama-server converts to a grammar in about a second (issue 48, item 2).

A schema that becomes a grammar (``response_format`` ``json_schema``, a forced tool's parameters,
Ollama's ``format``, an Anthropic forced tool) is converted by llama-server on its request thread
before anything is generated; a large one takes seconds to minutes and gigabytes, and at 20,000
properties it killed the child. This bench starts one bare llama-server on SmolLM2-135M (the
real demo model) and sends one chat request with ``max_tokens: 1`` per schema, sweeping each
dimension Werk bounds (docs/compat.md, "Schema bounds"):

* ``properties`` - an object of N integer properties;
* ``depth``      - objects nested D deep (not bounded by Werk: a request body nests at most
                   64 levels, and 256 convert in 0.05 s);
* ``enum``       - one string property with an enum of E distinct values;
* ``pattern``    - one string property whose ``pattern`` is L characters (an alternation);
* ``size``       - the serialized size of the schema at the properties sweep's points.

Each point's time is the median of ``--reps`` requests (a sweep stops after a point above
``--stop-s``). The bound printed for each dimension is the largest point measured under
``--target-s``, and the ``RATIO`` lines give the conversion time at Werk's bounds
(``werk_host.protocol.schemas``) over the target (<= 1.0 passes).
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from werk_llamacpp.binary import find_llama_server  # noqa: E402
from werk_llamacpp.process import LlamaServerProcess  # noqa: E402

from werk_host.protocol.schemas import SCHEMA_BOUNDS  # noqa: E402
from werk_host.realmodel import smollm2_gguf  # noqa: E402

Schema = dict[str, Any]


def properties(n: int) -> Schema:
    return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}


def depth(d: int) -> Schema:
    schema: Schema = {"type": "integer"}
    for _ in range(d):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def enum(e: int) -> Schema:
    return {"type": "object", "properties": {"a": {"type": "string", "enum": [f"v{i}" for i in range(e)]}}}


def pattern(length: int) -> Schema:
    alternatives = "|".join(f"x{i}" for i in range(length))[:length].rstrip("|x")
    return {"type": "object", "properties": {"a": {"type": "string", "pattern": f"^({alternatives})$"}}}


SWEEPS: dict[str, tuple[Callable[[int], Schema], list[int]]] = {
    "properties": (properties, [64, 128, 256, 512, 640, 768, 896, 1024, 2048]),
    "depth": (depth, [8, 16, 32, 64, 128, 256]),
    "enum": (enum, [256, 1024, 4096, 16384]),
    "pattern": (pattern, [256, 1024, 4096, 16384]),
}


def convert_s(port: int, key: str | None, schema: Schema, timeout: float) -> float | None:
    """Seconds llama-server takes to answer one 1-token chat constrained by ``schema``; ``None``
    when it did not answer within ``timeout`` or refused the schema."""
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    }
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    began = time.perf_counter()
    try:
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
        answer = conn.getresponse()
        answer.read()
    except OSError:
        return None
    finally:
        conn.close()
    return time.perf_counter() - began if answer.status == 200 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--target-s", type=float, default=1.0)
    parser.add_argument("--stop-s", type=float, default=3.0)
    args = parser.parse_args(argv)
    binary = find_llama_server(use_path=False)
    proc = LlamaServerProcess(smollm2_gguf(), binary=binary, parallel=1, ctx=2048, env_args="")

    def measure(schema: Schema) -> float | None:
        nonlocal proc
        if not proc.alive():
            proc = LlamaServerProcess(smollm2_gguf(), binary=binary, parallel=1, ctx=2048, env_args="")
            proc.start()
        assert proc.port is not None
        times = [convert_s(proc.port, proc.api_key, schema, args.stop_s * 10) for _ in range(args.reps)]
        known = [t for t in times if t is not None]
        return statistics.median(known) if len(known) == len(times) else None

    proc.start()
    try:
        base = measure({"type": "object"})
        print(f"floor: a 1-token chat with a trivial schema takes {base or float('nan'):.3f} s")
        found: dict[str, int] = {}
        print(f"{'dimension':<12}{'value':>8}{'bytes':>10}{'seconds':>10}")
        for name, (build, points) in SWEEPS.items():
            for value in points:
                schema = build(value)
                seconds = measure(schema)
                shown = "failed" if seconds is None else f"{seconds:.3f}"
                print(f"{name:<12}{value:>8}{len(json.dumps(schema)):>10}{shown:>10}", flush=True)
                if seconds is not None and seconds <= args.target_s:
                    found[name] = value
                    if name == "properties":
                        found["size"] = len(json.dumps(schema))
                if seconds is None or seconds > args.stop_s:
                    break
        for name, value in found.items():
            print(f"measured bound {name} = {value} (largest point at or under {args.target_s:g} s)")
        widest = len(json.dumps(properties(SCHEMA_BOUNDS["properties"]), separators=(",", ":")))
        print(f"the properties bound's schema is {widest} bytes; the size bound is {SCHEMA_BOUNDS['size']}")
        for name, bound in SCHEMA_BOUNDS.items():
            if name == "size":  # no sweep of its own: printed above
                continue
            build = SWEEPS[name][0]
            seconds = measure(build(bound))
            ratio = float("inf") if seconds is None else seconds / args.target_s
            print(f"RATIO grammar_{name}_at_bound_{bound} = {ratio:.2f} (target <= 1.0)")
    finally:
        proc.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
