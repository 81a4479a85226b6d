"""The generation admission estimator, shared by ``/werk/v1/chat/admission`` and generation.

Used only when a backend's native counter is unavailable. It is deliberately conservative
(over-counts): one token per 3 UTF-8 bytes of every text field, plus a fixed per-message
template overhead.
"""

from __future__ import annotations

import json
import math

from werk_host.protocol import ChatRequest

BYTES_PER_TOKEN = 3
PER_MESSAGE_OVERHEAD = 8


def estimate_input_tokens(request: ChatRequest) -> int:
    total_bytes = 0
    for message in request.messages:
        payload = message.model_dump(mode="json", exclude_none=True)
        total_bytes += len(json.dumps(payload, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    if request.tools:
        total_bytes += len(json.dumps(request.tools, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    return math.ceil(total_bytes / BYTES_PER_TOKEN) + PER_MESSAGE_OVERHEAD * len(request.messages)
