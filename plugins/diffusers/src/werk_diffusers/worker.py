"""The diffusers worker: Diffusers pipelines on torch behind the kit's small HTTP server on
127.0.0.1, one worker per host for every model of the backend (a bounded pipeline LRU).

Run by path with the engine virtualenv's interpreter (``scripts/setup-engine-venv.sh diffusers``
makes one), never imported by the plugin: it needs only the standard library, ``torch``,
``diffusers`` and ``PIL``, and nothing of Werk. The server itself (key check, loopback, bounded
reads, the streamed route) is the kit's worker side, ``werk_host/plugin/engine_worker.py``,
loaded by the path the adapter passes as ``--kit``::

    <venv>/bin/python worker.py --kit KIT --port P [--device cpu] [--threads N] [--pipelines N]

Contract (docs/diffusers.md, "The worker"; docs/plugin-kit.md, "Engine workers"):

* ``POST /images`` ``{"model_dir", "identity", "mode": "txt2img"|"img2img", "prompt",
  "negative_prompt", "width", "height", "steps", "guidance_scale", "seed", "sampler", "n",
  "init_image": base64 or null, "strength"}`` streams NDJSON lines:
  ``{"event": "progress", "step": k, "steps": N}`` after every denoising step (k from 1, counted
  over the whole batch: N is the steps of one image times ``n``), then ``{"event": "result",
  "images": [base64 PNG, ...], "seeds": [...], "info": {"sampler", "steps", "pipeline"}}``, or
  ``{"event": "cancelled"}`` once the client went away (the kit sets ``cancelled``; the next
  step's callback stops the pipeline). Image *i* is its own pipeline call with
  ``torch.Generator("cpu").manual_seed(seed + i)``, its PNG written without metadata, so the
  same request gives the same bytes (:func:`generate`, which tests also run directly).
* ``POST /pipelines`` ``{}`` answers ``{"loaded": [{"identity", "class", "img2img"}]}``, most
  recently used last, outside the generation lock (the adapter's capability evidence).
* Pipelines are kept in an LRU keyed by ``identity`` (the model's files identity, which the
  adapter sends), at most ``--pipelines`` (``WERK_MEDIA_PIPELINE_CACHE_SIZE``) at once; a new
  one evicts the least recently used. Each is ``DiffusionPipeline.from_pretrained(model_dir)``
  (without a safety checker where the pipeline takes one), float32 on CPU, float16 on CUDA, its
  progress bar off, with ``AutoPipelineForImage2Image.from_pipe`` beside it where that works.
"""

from __future__ import annotations

import argparse
import base64
import gc
import importlib
import importlib.util
import inspect
import io
import json
import queue
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KEY_ENV = "WERK_DIFFUSERS_WORKER_KEY"
#: AUTOMATIC1111's sampler names and the diffusers scheduler classes they are.
SAMPLERS: dict[str, str] = {
    "Euler": "EulerDiscreteScheduler",
    "Euler a": "EulerAncestralDiscreteScheduler",
    "DDIM": "DDIMScheduler",
    "PNDM": "PNDMScheduler",
    "PLMS": "PNDMScheduler",
    "DPM++ 2M": "DPMSolverMultistepScheduler",
    "LMS": "LMSDiscreteScheduler",
    "Heun": "HeunDiscreteScheduler",
}
DEFAULT_SAMPLER = "Euler a"


class _Stop(Exception):
    """Raised from the step callback to stop a cancelled generation."""


@dataclass
class Pipeline:
    """One loaded model: its text-to-image pipeline, image-to-image beside it where it works."""

    pipe: Any
    img2img: Any
    scheduler_config: Any

    @property
    def class_name(self) -> str:
        return type(self.pipe).__name__


def load_pipeline(torch: Any, diffusers: Any, model_dir: str, device: str) -> Pipeline:
    """``model_dir``'s pipeline (module docstring)."""
    dtype = torch.float16 if device.startswith("cuda") else torch.float32
    kwargs: dict[str, Any] = {"torch_dtype": dtype}
    index = json.loads((Path(model_dir) / "model_index.json").read_text(encoding="utf-8"))
    cls = getattr(diffusers, str(index.get("_class_name", "")), None) if isinstance(index, dict) else None
    params = inspect.signature(cls.__init__).parameters if cls is not None else {}
    if "safety_checker" in params:
        kwargs["safety_checker"] = None
    if "requires_safety_checker" in params:
        kwargs["requires_safety_checker"] = False
    pipe = diffusers.DiffusionPipeline.from_pretrained(model_dir, **kwargs)
    pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    try:
        img2img = diffusers.AutoPipelineForImage2Image.from_pipe(pipe)
        img2img.set_progress_bar_config(disable=True)
    except (ValueError, TypeError, KeyError, AttributeError):
        img2img = None
    return Pipeline(pipe, img2img, pipe.scheduler.config)


def _png(image: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _init_image(raw: Any, width: int, height: int) -> Any:
    pil: Any = importlib.import_module("PIL.Image")
    if not isinstance(raw, str):
        raise ValueError("img2img needs init_image (base64)")
    data = base64.b64decode(raw, validate=True)
    with pil.open(io.BytesIO(data)) as opened:
        return opened.convert("RGB").resize((width, height))


def generate(
    torch: Any,
    diffusers: Any,
    loaded: Pipeline,
    body: dict[str, Any],
    progress: Callable[[int, int], None],
    cancelled: Callable[[], bool],
) -> dict[str, Any]:
    """Run one ``/images`` request on ``loaded``; ``progress(k, N)`` after every step; raises
    :class:`_Stop` once ``cancelled()``. The result line's fields (``images`` base64 PNG)."""
    mode = body.get("mode", "txt2img")
    sampler = body.get("sampler") or DEFAULT_SAMPLER
    if sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}")
    width, height = int(body["width"]), int(body["height"])
    steps, n, seed = int(body["steps"]), int(body.get("n", 1)), int(body["seed"])
    if mode == "img2img":
        pipe = loaded.img2img
        if pipe is None:
            raise ValueError(f"{loaded.class_name} cannot do image-to-image")
        init = _init_image(body.get("init_image"), width, height)
    elif mode == "txt2img":
        pipe, init = loaded.pipe, None
    else:
        raise ValueError(f"unknown mode {mode!r}")
    images: list[str] = []
    done = 0
    for i in range(n):
        pipe.scheduler = getattr(diffusers, SAMPLERS[sampler]).from_config(loaded.scheduler_config)
        per_image = [steps]

        def on_step(
            p: Any, step: int, timestep: Any, kwargs: dict[str, Any], per_image: list[int] = per_image
        ) -> dict[str, Any]:
            nonlocal done
            if cancelled():
                raise _Stop()
            total = int(getattr(p, "num_timesteps", 0) or 0) or per_image[0]
            per_image[0] = total
            done += 1
            progress(done, total * n)
            return kwargs

        args: dict[str, Any] = {
            "prompt": str(body.get("prompt", "")),
            "negative_prompt": str(body.get("negative_prompt") or "") or None,
            "num_inference_steps": steps,
            "guidance_scale": float(body.get("guidance_scale", 7.0)),
            "generator": torch.Generator("cpu").manual_seed(seed + i),
            "callback_on_step_end": on_step,
            "output_type": "pil",
        }
        if init is None:
            args.update(width=width, height=height)
        else:
            args.update(image=init, strength=float(body.get("strength", 0.75)))
        with torch.inference_mode():
            out = pipe(**args)
        images.append(base64.b64encode(_png(out.images[0])).decode())
    return {
        "images": images,
        "seeds": [seed + i for i in range(n)],
        "info": {"sampler": sampler, "steps": steps, "pipeline": type(pipe).__name__},
    }


class Engine:
    """The pipeline LRU (the kit's engine: ``answer`` and ``stream`` only)."""

    def __init__(self, device: str, capacity: int) -> None:
        self.torch: Any = importlib.import_module("torch")
        self.diffusers: Any = importlib.import_module("diffusers")
        self.diffusers.utils.logging.disable_progress_bar()
        if device == "auto":
            device = "cuda" if self.torch.cuda.is_available() else "cpu"
        self.device = device
        self.capacity = max(1, capacity)
        self.pipelines: OrderedDict[str, Pipeline] = OrderedDict()
        self.lru_lock = threading.Lock()

    def answer(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        if path != "/pipelines":
            return None
        with self.lru_lock:
            loaded = [
                {"identity": k, "class": p.class_name, "img2img": p.img2img is not None}
                for k, p in self.pipelines.items()
            ]
        return {"loaded": loaded}

    def pipeline(self, identity: str, model_dir: str) -> Pipeline:
        """``identity``'s pipeline, loaded now (evicting the least recently used) when it is not."""
        with self.lru_lock:
            found = self.pipelines.get(identity)
            if found is not None:
                self.pipelines.move_to_end(identity)
                return found
            while len(self.pipelines) >= self.capacity:
                self.pipelines.popitem(last=False)
        gc.collect()
        if self.device.startswith("cuda"):
            self.torch.cuda.empty_cache()
        loaded = load_pipeline(self.torch, self.diffusers, model_dir, self.device)
        with self.lru_lock:
            self.pipelines[identity] = loaded
        return loaded

    def stream(self, path: str, body: dict[str, Any], cancelled: threading.Event) -> Iterator[dict[str, Any]] | None:
        if path != "/images":
            return None
        identity, model_dir = body.get("identity"), body.get("model_dir")
        if not isinstance(identity, str) or not identity or not isinstance(model_dir, str):
            raise ValueError("identity and model_dir are required")
        if (body.get("sampler") or DEFAULT_SAMPLER) not in SAMPLERS:
            raise ValueError(f"unknown sampler {body.get('sampler')!r}")
        for name in ("width", "height", "steps", "seed"):
            if not isinstance(body.get(name), int):
                raise ValueError(f"{name} must be an integer")
        return self._images(identity, model_dir, body, cancelled)

    def _images(
        self, identity: str, model_dir: str, body: dict[str, Any], cancelled: threading.Event
    ) -> Iterator[dict[str, Any]]:
        loaded = self.pipeline(identity, model_dir)
        events: queue.Queue[tuple[str, Any]] = queue.Queue()

        def work() -> None:
            try:
                result = generate(
                    self.torch,
                    self.diffusers,
                    loaded,
                    body,
                    lambda k, total: events.put(("progress", (k, total))),
                    cancelled.is_set,
                )
                events.put(("result", result))
            except _Stop:
                events.put(("cancelled", None))
            except BaseException as err:  # noqa: BLE001 - handed to the stream
                events.put(("error", err))

        thread = threading.Thread(target=work, name="generation", daemon=True)
        thread.start()
        try:
            while True:
                kind, value = events.get()
                if kind == "progress":
                    yield {"event": "progress", "step": value[0], "steps": value[1]}
                elif kind == "result":
                    yield {"event": "result", **value}
                    return
                elif kind == "cancelled":
                    yield {"event": "cancelled"}
                    return
                else:
                    raise value
        finally:
            cancelled.set()  # closed early (the client went away): stop at the next step
            thread.join()


def _kit(path: str) -> Any:
    """The kit's worker side (``werk_host/plugin/engine_worker.py``), by path: no Werk here."""
    spec = importlib.util.spec_from_file_location("werk_engine_worker", path)
    kit = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(kit)  # type: ignore[union-attr]
    return kit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="worker.py")
    parser.add_argument("--kit", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--pipelines", type=int, default=1)
    args = parser.parse_args(argv)

    def load() -> Engine:
        engine = Engine(args.device, args.pipelines)
        if args.threads > 0:
            engine.torch.set_num_threads(args.threads)
        return engine

    status: int = _kit(args.kit).run(KEY_ENV, args.port, load)
    return status


if __name__ == "__main__":
    sys.exit(main())
