"""The ComfyUI compatibility routes (docs/media.md, "Comfy")."""

from __future__ import annotations

import json
from typing import Any

import falcon

from werk_host.errors import WerkError
from werk_host.service.jobs import JobService
from werk_host.service.media import MediaService


def render_error(resp: falcon.Response, status: int, error: WerkError) -> None:
    resp.status = status
    resp.content_type = "application/json"
    resp.text = json.dumps({"error": error.code.value, "detail": error.public_message()})


def add_routes(app: falcon.App[Any, Any], media: MediaService, jobs: JobService) -> None:
    pass
