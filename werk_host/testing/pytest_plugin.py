"""The kit's pytest plugin (entry point ``pytest11: werk_host``): loaded by every pytest run in
an environment where werk-host is installed, so importing it stays cheap (no server imports).

Fixtures any plugin's suite can use:

* ``werk_home``: an empty, private WERK home directory for the test (``tmp_path/werk-home``).
* ``werk_api_key``: a fresh bearer key for the test.
* ``werk_server``: a :class:`WerkServerFactory`; ``werk_server(plugin, model=...)`` starts the
  real host around ``plugin`` on an ephemeral port, keyed with ``werk_api_key``, and returns a
  :class:`~werk_host.testing.hosts.LiveHost` (``url``, ``host``, ``api``); every host it
  started is stopped when the test ends.
* ``smollm2_gguf``: the path of the real SmolLM2-135M-Instruct GGUF (session-scoped; fetched and
  hash-checked once into the user cache by :mod:`werk_host.realmodel`). A test that needs a real
  model's behaviour (chat template, exact counts, coherent text) uses it; fast tests keep a
  generated model.

Markers registered (unless the project already does): ``llamaserver``, ``slow``.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from werk_host.models import ModelManifest
    from werk_host.testing.hosts import LiveHost

MARKERS: Mapping[str, str] = {
    "llamaserver": "needs a real llama-server binary",
    "slow": "long-running durability tests",
}


def pytest_configure(config: pytest.Config) -> None:
    registered = {line.split(":", 1)[0].split("(", 1)[0].strip() for line in config.getini("markers")}
    for name, description in MARKERS.items():
        if name not in registered:
            config.addinivalue_line("markers", f"{name}: {description}")


class WerkServerFactory:
    """Starts served hosts for one test (see :func:`werk_host.testing.hosts.serving`)."""

    def __init__(self, home: Path, api_key: str) -> None:
        self.home = home
        self.api_key = api_key
        self._started = 0
        self._stack = ExitStack()

    def __call__(
        self,
        plugin: object,
        *,
        plugin_name: str | None = None,
        model: ModelManifest | Path | str | None = None,
        backend_options: Mapping[str, object] | None = None,
        api_keys: tuple[str, ...] | None = None,
        home: Path | None = None,
        **options: Any,
    ) -> LiveHost:
        """Serve a host around ``plugin`` and return it; ``api_keys`` defaults to the test's
        ``werk_api_key``, ``home`` to ``werk_home`` (a sibling directory for each further
        host). Other ``options`` go to :func:`werk_host.testing.hosts.make_host`."""
        from werk_host.testing.hosts import serving

        if home is None:
            home = self.home if not self._started else self.home.with_name(f"{self.home.name}-{self._started}")
        self._started += 1
        keys = (self.api_key,) if api_keys is None else api_keys
        served = serving(
            home,
            plugin=plugin,
            plugin_name=plugin_name,
            model=model,
            backend_options=backend_options,
            api_keys=keys,
            **options,
        )
        return self._stack.enter_context(served)

    def close(self) -> None:
        """Stop every host this factory started (newest first)."""
        self._stack.close()


@pytest.fixture
def werk_home(tmp_path: Path) -> Path:
    """An empty, private (0700) WERK home for this test."""
    home = tmp_path / "werk-home"
    home.mkdir(mode=0o700)
    return home


@pytest.fixture
def werk_api_key() -> str:
    """A fresh bearer key for this test's hosts."""
    return f"sk-werk-test-{secrets.token_hex(12)}"


@pytest.fixture
def werk_server(werk_home: Path, werk_api_key: str) -> Iterator[WerkServerFactory]:
    """A factory that serves hosts around plugins for this test; all stop when it ends."""
    factory = WerkServerFactory(werk_home, werk_api_key)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The verified SmolLM2-135M-Instruct GGUF (see :mod:`werk_host.realmodel`)."""
    from werk_host.realmodel import smollm2_gguf as fetch

    return fetch()


__all__ = ["MARKERS", "WerkServerFactory", "smollm2_gguf", "werk_api_key", "werk_home", "werk_server"]
