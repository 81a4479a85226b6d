"""Engine failures stay on their request: a real failure inside the engine becomes a redacted,
typed ``internal`` error, and the engine and host keep serving.

The failure used is one the engine really has: with ``max_seqs`` above 1 it batches equal-length
prompts, which fails inside it on a quantized model (``input tensor is not contiguous`` in
``QMatMul``) — the reason the bridge's default is ``max_seqs=1``."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from werk_candle_bridge import plugin
from werk_candle_bridge.generation import FAILED

from werk_host.plugin import REDACTED_MESSAGES, ErrorCode, ModelManifest
from werk_host.testing.pytest_plugin import WerkServerFactory

pytestmark = pytest.mark.engine


def test_a_failing_batch_fails_its_requests_only(smollm2_gguf: Path, werk_server: WerkServerFactory) -> None:
    manifest = ModelManifest.from_paths("smol", [smollm2_gguf], backend="candle")
    live = werk_server(plugin, model=manifest, backend_options={"max_seqs": 4})
    status, doc = live.api.post("/werk/v1/chat/count_tokens", {"messages": [{"role": "user", "content": "x"}]})
    assert status == 200, doc  # loaded before the burst, so the four requests meet in one batch
    body = {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}
    outcomes: list[tuple[int, dict[str, Any]]] = []
    start = threading.Barrier(4)

    def one() -> None:
        start.wait()
        outcomes.append(live.api.post("/v1/completions", body))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    failed = [doc for status, doc in outcomes if status != 200]
    if not failed:
        pytest.skip("the engine served all four requests without batching them; the failure did not occur")
    for doc in failed:
        error = doc["error"]
        assert error["code"] == ErrorCode.INTERNAL.value
        assert error["message"] == REDACTED_MESSAGES[ErrorCode.INTERNAL]
        assert "tensor" not in str(doc) and "candle_core" not in str(doc) and FAILED not in str(doc)
    status, doc = live.api.post("/v1/completions", {**body, "max_tokens": 1})
    assert status == 200, doc  # the engine and the host still serve
