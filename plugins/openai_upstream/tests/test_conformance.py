"""The whole conformance suite on a remote instance: a file-less manifest, its endpoint and key
variable, and a real llama-server upstream the suite takes away (and brings back)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from conftest import SERVED, Upstream

from werk_host.plugin import Adapter, ModelManifest
from werk_host.testing.conformance import ConformanceTarget, WerkConformance

KEY_ENV = "WERK_CONFORMANCE_UPSTREAM_KEY"


class TestConformance(WerkConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, upstream: Upstream) -> ConformanceTarget:
        @contextmanager
        def stopped(adapter: Adapter) -> Iterator[None]:
            upstream.stop()
            try:
                yield
            finally:
                upstream.start()

        return ConformanceTarget(
            entry_point="openai_upstream",
            model=ModelManifest(SERVED, (), "openai_upstream"),  # remote: no local files
            endpoint=upstream.endpoint,
            api_key_env=KEY_ENV,
            environ={KEY_ENV: upstream.key},
            stop_backend=stopped,
        )
