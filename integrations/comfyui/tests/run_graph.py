"""Run one API-format prompt with the nodes loaded as ComfyUI loads them, in the interpreter
that runs this (the media tests use the engine's, which has torch as ComfyUI does):
``python run_graph.py PACKAGE PROMPT.json OUT``. Each output lands in OUT: an ``IMAGE`` as
``<node>-<i>.npy``; an ``AUDIO`` as ``<node>-<i>.npy`` with its rate in ``outputs.json``; a
``STRING`` in ``outputs.json``; the progress the nodes reported as well. A node error is
written as ``{"error": ...}`` and exits 1."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from comfyui_host import ExecutionError, execute, load_custom_node, stand_in_comfy, validate


def main(package: Path, prompt_file: Path, out: Path) -> int:
    record = stand_in_comfy()
    mappings = load_custom_node(package)
    prompt = json.loads(prompt_file.read_text())
    errors = validate(prompt, mappings)
    if errors:
        (out / "outputs.json").write_text(json.dumps({"node_errors": errors}))
        return 1
    try:
        outputs = execute(prompt, mappings)
    except ExecutionError as err:
        (out / "outputs.json").write_text(json.dumps({"error": str(err.error)}))
        return 1
    import numpy as np

    shown: dict[str, Any] = {"progress": record.progress}
    for node_id, values in outputs.items():
        for index, value in enumerate(values):
            key = f"{node_id}-{index}"
            if isinstance(value, str):
                shown[key] = value
            elif isinstance(value, dict) and "waveform" in value:
                np.save(out / f"{key}.npy", value["waveform"].numpy())
                shown[key] = {"sample_rate": value["sample_rate"]}
            elif hasattr(value, "numpy"):
                np.save(out / f"{key}.npy", value.numpy())
    (out / "outputs.json").write_text(json.dumps(shown))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])))
