"""The image and speech nodes, on the job routes (docs/comfyui.md, "Images and speech").

Both submit ``POST /werk/v1/jobs`` (kind ``image`` or ``speech``), poll ``GET
/werk/v1/jobs/{id}`` every :data:`POLL_S` seconds — reporting the job's progress on ComfyUI's
progress bar, and cancelling the job when ComfyUI's run is interrupted — then fetch the result
files. **Werk Image** answers ComfyUI's ``IMAGE`` (a float tensor ``[batch, height, width, 3]``
in 0..1), **Werk Speech** its ``AUDIO`` (``{"waveform": [1, channels, samples], "sample_rate"}``,
from a WAV result); both also answer the job id. torch, numpy and Pillow come with ComfyUI and
are imported when a result is converted.
"""

from __future__ import annotations

import io
import time
import wave
from collections.abc import Callable
from typing import Any, Final

from werk_host.protocol import JobCreate, JobStatus, JobView

from .base import MODEL_INPUT, WerkNode, integer, number, text
from .connection import CONNECTION, Connection
from .errors import WerkNodeError, checked, served

POLL_S: Final = 0.1
MAX_SIDE: Final = 2048
_DONE: Final = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


def _comfy_hooks(total: int) -> tuple[Callable[[int, int], None], Callable[[], None]]:
    """ComfyUI's progress bar and interrupt check, where this runs inside ComfyUI."""
    try:
        import comfy.model_management as management  # type: ignore[import-not-found]
        import comfy.utils  # type: ignore[import-not-found]
    except ImportError:
        return (lambda value, total: None), (lambda: None)
    bar = comfy.utils.ProgressBar(total)
    return bar.update_absolute, management.throw_exception_if_processing_interrupted


def run_job(connection: Connection, request: JobCreate, timeout_s: float) -> JobView:
    """Submit ``request`` and wait for it to end: the succeeded job, or a node error."""
    client = connection.client
    with served(connection.base_url):
        job = client.create_job(request)
        progress, interrupted = _comfy_hooks(100)
        deadline = time.monotonic() + timeout_s
        while job.status not in _DONE:
            try:
                interrupted()
            except BaseException:
                client.cancel_job(job.id)
                raise
            if time.monotonic() > deadline:
                client.cancel_job(job.id)
                raise WerkNodeError("unavailable", f"the job did not finish in {timeout_s:g} s", "raise timeout_s")
            time.sleep(POLL_S)
            job = client.job(job.id)
            progress(round(job.progress.fraction * 100), 100)
    if job.status is not JobStatus.SUCCEEDED:
        error = job.error
        code, message = (error.code, error.message) if error else ("internal", f"the job ended {job.status.value}")
        raise WerkNodeError(code, message)
    return job


def _files(connection: Connection, job: JobView) -> list[bytes]:
    with served(connection.base_url):
        return [connection.client.job_result(job.id, item.name)[0] for item in job.results]


def _image_tensor(pngs: list[bytes]) -> Any:
    import numpy as np
    import torch  # type: ignore[import-not-found]
    from PIL import Image

    frames = [np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.float32) / 255.0 for png in pngs]
    return torch.from_numpy(np.stack(frames))


def _audio(wav_bytes: bytes) -> dict[str, Any]:
    import numpy as np
    import torch

    with wave.open(io.BytesIO(wav_bytes)) as reader:
        channels, width, rate = reader.getnchannels(), reader.getsampwidth(), reader.getframerate()
        frames = reader.readframes(reader.getnframes())
    if width != 2:
        raise WerkNodeError("internal", f"the speech result has {8 * width}-bit samples; 16-bit was expected")
    samples = np.frombuffer(frames, dtype="<i2").astype(np.float32) / 32768.0
    waveform = torch.from_numpy(samples.reshape(-1, channels).T.copy()).unsqueeze(0)
    return {"waveform": waveform, "sample_rate": rate}


class WerkImageNode(WerkNode):
    RETURN_TYPES = ("IMAGE", "STRING")
    RETURN_NAMES = ("images", "job_id")
    PLACEHOLDERS = {"prompt": "?"}

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "connection": (CONNECTION,),
                "prompt": ("STRING", {"multiline": True, "default": ""}),
                "negative_prompt": ("STRING", {"multiline": True, "default": ""}),
                "width": ("INT", {"default": 512, "min": 8, "max": MAX_SIDE, "step": 8}),
                "height": ("INT", {"default": 512, "min": 8, "max": MAX_SIDE, "step": 8}),
                "steps": ("INT", {"default": 20, "min": 1, "max": 150}),
                "guidance_scale": ("FLOAT", {"default": 7.0, "min": 0.0, "max": 50.0, "step": 0.5}),
                "seed": ("INT", {"default": 0, "min": 0, "max": 2**32 - 1}),
                "batch_size": ("INT", {"default": 1, "min": 1, "max": 8}),
                "timeout_s": ("FLOAT", {"default": 600.0, "min": 1.0, "max": 86400.0}),
            },
            "optional": {"model": MODEL_INPUT},
        }

    @classmethod
    def build(cls, **inputs: Any) -> JobCreate:
        number(inputs, "timeout_s", 1.0, 86400.0)
        fields = {
            "prompt": text(inputs, "prompt"),
            "negative_prompt": text(inputs, "negative_prompt", required=False) or "",
            "width": integer(inputs, "width", 8, MAX_SIDE),
            "height": integer(inputs, "height", 8, MAX_SIDE),
            "steps": integer(inputs, "steps", 1, 150),
            "guidance_scale": number(inputs, "guidance_scale", 0.0, 50.0),
            "seed": integer(inputs, "seed", 0, 2**32 - 1),
            "n": integer(inputs, "batch_size", 1, 8),
        }
        body = {"kind": "image", "model": text(inputs, "model", required=False, limit=256), "input": fields}
        return checked(lambda: JobCreate.model_validate(body), {"image.input.n": "batch_size", "image.input": "input"})

    def run(self, connection: Connection, **inputs: Any) -> tuple[Any, str]:
        job = run_job(connection, self.build(**inputs), inputs["timeout_s"])
        return (_image_tensor(_files(connection, job)), job.id)


class WerkSpeechNode(WerkNode):
    RETURN_TYPES = ("AUDIO", "STRING")
    RETURN_NAMES = ("audio", "job_id")
    PLACEHOLDERS = {"text": "?"}

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "connection": (CONNECTION,),
                "text": ("STRING", {"multiline": True, "default": ""}),
                "voice": ("STRING", {"default": "", "tooltip": "a speaker the model offers; empty: its default"}),
                "seed": ("INT", {"default": 0, "min": 0, "max": 2**32 - 1}),
                "timeout_s": ("FLOAT", {"default": 600.0, "min": 1.0, "max": 86400.0}),
            },
            "optional": {
                "model": MODEL_INPUT,
                "instructions": ("STRING", {"multiline": True, "default": "", "tooltip": "a style prompt"}),
                "language": ("STRING", {"default": ""}),
            },
        }

    @classmethod
    def build(cls, **inputs: Any) -> JobCreate:
        number(inputs, "timeout_s", 1.0, 86400.0)
        fields = {
            "input": text(inputs, "text", limit=16 << 10),
            "voice": text(inputs, "voice", required=False, limit=256),
            "instructions": text(inputs, "instructions", required=False, limit=16 << 10),
            "language": text(inputs, "language", required=False, limit=256),
            "seed": integer(inputs, "seed", 0, 2**32 - 1),
            "response_format": "wav",
        }
        body = {
            "kind": "speech",
            "model": text(inputs, "model", required=False, limit=256),
            "input": {k: v for k, v in fields.items() if v is not None},
        }
        return checked(lambda: JobCreate.model_validate(body), {"speech.input.input": "text", "speech.input": "input"})

    def run(self, connection: Connection, **inputs: Any) -> tuple[dict[str, Any], str]:
        job = run_job(connection, self.build(**inputs), inputs["timeout_s"])
        return (_audio(_files(connection, job)[0]), job.id)
