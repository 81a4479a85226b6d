"""The two opaque values that travel between Werk nodes on custom socket types
(docs/comfyui.md, "The handoff boundary"):

* ``WERK_CONNECTION`` — a :class:`Connection`: the server's base URL and the host's own
  :class:`~werk_host.client.WerkProtocolClient`. The API key is read when the Werk Connection
  node runs, from an environment variable or a file; it is never a widget value, so a saved
  workflow holds only the variable's name or the file's path.
* ``WERK_STATE_HANDOFF`` — a :class:`StateHandoff`: a prefill's single-use bearer handoff with
  the connection it belongs to. It is never a ``STRING`` or JSON output: its ``repr``/``str``
  show only the state id, it refuses pickling, JSON and copying, and it is spent by the first
  decode that takes it (a second use fails here, before any request).
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Any, Final, NoReturn

from pydantic import SecretStr

from werk_host.client import WerkProtocolClient

from .errors import WerkNodeError, invalid

CONNECTION: Final = "WERK_CONNECTION"
HANDOFF: Final = "WERK_STATE_HANDOFF"
KEY_SOURCES: Final = ("environment", "file", "none")
MAX_KEY_FILE_BYTES: Final = 4096


class Connection:
    """A server and the client that talks to it (the key lives inside the client only)."""

    __slots__ = ("base_url", "client")

    def __init__(self, base_url: str, client: WerkProtocolClient) -> None:
        self.base_url = base_url
        self.client = client

    def __repr__(self) -> str:
        return f"Connection({self.base_url}, key={'set' if self.client.has_api_key else 'none'})"

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:
        raise TypeError("a Werk connection holds a secret and cannot be pickled")


class StateHandoff:
    """A prefill's handoff: spent once by :meth:`take` (module docstring)."""

    __slots__ = ("_lock", "_secret", "connection", "state_id", "prompt_tokens")

    def __init__(self, connection: Connection, secret: SecretStr, state_id: str | None, prompt_tokens: int) -> None:
        self.connection = connection
        self.state_id = state_id
        self.prompt_tokens = prompt_tokens
        self._secret: SecretStr | None = secret
        self._lock = threading.Lock()

    @property
    def spent(self) -> bool:
        return self._secret is None

    def take(self) -> SecretStr:
        """The secret, once; later calls fail with ``expired_handoff`` before any request."""
        with self._lock:
            secret, self._secret = self._secret, None
        if secret is None:
            raise WerkNodeError("expired_handoff", "this handoff was already decoded")
        return secret

    def __repr__(self) -> str:
        return f"StateHandoff(state_id={self.state_id}, {'spent' if self.spent else '[secret]'})"

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:
        raise TypeError("a Werk state handoff is a secret and cannot be pickled or copied")

    def __copy__(self) -> NoReturn:
        raise TypeError("a Werk state handoff is single-use and cannot be copied")

    def __deepcopy__(self, memo: dict[int, Any]) -> NoReturn:
        raise TypeError("a Werk state handoff is single-use and cannot be copied")


def read_key(source: str, env_name: str, key_file: str) -> str | None:
    """The API key from ``source`` (``environment``: the variable ``env_name``; ``file``: the
    first line of ``key_file``, which must be a regular file others cannot read; ``none``)."""
    if source == "none":
        return None
    if source == "environment":
        if not env_name or not env_name.replace("_", "").isalnum():
            raise invalid("api_key_env: name an environment variable (letters, digits, _)")
        key = os.environ.get(env_name)
        if not key:
            raise WerkNodeError(
                "unauthorized", f"the environment variable {env_name} is not set", f"set {env_name} for ComfyUI"
            )
        return key.strip()
    if source == "file":
        path = Path(os.path.expanduser(key_file))
        try:
            info = path.stat()
        except OSError:
            raise invalid("api_key_file: no such file") from None
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_KEY_FILE_BYTES:
            raise invalid(f"api_key_file: must be a regular file of at most {MAX_KEY_FILE_BYTES} bytes")
        if os.name == "posix" and info.st_mode & 0o077:
            raise invalid("api_key_file: others can read it; chmod 600 the file")
        lines = path.read_text(encoding="utf-8", errors="strict").splitlines()
        key = lines[0].strip() if lines else ""
        if not key:
            raise invalid("api_key_file: the file is empty")
        return key
    raise invalid(f"api_key_source: one of {', '.join(KEY_SOURCES)}")
