"""A backend server elsewhere: an OpenAI-compatible endpoint some other machine (or process) runs,
reached over HTTP or HTTPS (docs/plugin-kit.md, "Backends without local files").

A remote deployment instance (docs/deployments.md, "Remote instances") hands its plugin
``endpoint`` and ``api_key_env`` as backend options; nothing is launched locally. This module
is what such a plugin is built on:

* :class:`Endpoint`: ``http(s)://host[:port][/prefix]`` parsed. The prefix is the server's
  OpenAI base path: ``https://host/openai/v1`` sends a chat to ``/openai/v1/chat/completions``;
  a URL without a path means ``/v1``. User names, passwords, queries and fragments are refused
  (a key belongs in the environment or a file, never in a URL).
* :class:`RemoteSettings` and :func:`remote_settings`: the options ``endpoint``,
  ``api_key_env`` (the environment variable holding the key), ``api_key_file`` (a file whose
  first line is the key) and ``ca_file`` (PEM certificates to trust instead of the system's),
  checked with a :class:`ValueError` that names the option; :func:`check_options` is a
  factory's ``validate_options`` for them.
* :class:`Remote`: one server. A :class:`~werk_host.plugin.http.ConnectionPool` (HTTPS with the
  system's trust store or ``ca_file``, under the prefix, the key as a bearer token), a
  :meth:`Remote.probe` (``GET <prefix>/models``: the served model ids, or a
  :class:`Failure` with its reason), :meth:`Remote.ready` (the last probe's failure as a
  :class:`~werk_host.plugin.WerkError`, probing again once it is older than ``retry_s``) and
  :meth:`Remote.forward` (the relay, with the server's refusals and failures mapped to an
  ``unavailable`` that names the reason).

Every message names what went wrong (the connection refused, the key refused, a status), never
the key, the URL or the server's own text; the operator's log line has the URL and the status.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import JsonValue

from werk_host.config import BackendBounds
from werk_host.errors import ErrorCode, WerkError
from werk_host.plugin.http import ClientGone, ConnectionPool, forward
from werk_host.seam import InferenceResponse

__all__ = [
    "DEFAULT_PREFIX",
    "OPTIONS",
    "PROBE_TIMEOUT_S",
    "Endpoint",
    "Failure",
    "Probe",
    "Remote",
    "RemoteSettings",
    "check_options",
    "classify",
    "remote_settings",
]

log = logging.getLogger(__name__)

#: The OpenAI base path of an endpoint given without a path.
DEFAULT_PREFIX = "/v1"
#: The options this module reads (a plugin may accept more: ``remote_settings(..., extra=)``).
OPTIONS = ("endpoint", "api_key_env", "api_key_file", "ca_file")
PROBE_TIMEOUT_S = 5.0
#: How long a failed probe is answered from its record before the next request probes again.
RETRY_S = 2.0
_ENV_NAME = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


@dataclass(frozen=True)
class Endpoint:
    """Where a server answers: scheme, host, port and OpenAI base path (``/v1``, ``/a/v1``)."""

    tls: bool
    host: str
    port: int
    prefix: str = DEFAULT_PREFIX

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        """``http(s)://host[:port][/prefix]``; :class:`ValueError` says what is wrong."""
        try:
            parts = urlsplit(url.strip())
            port = parts.port
        except ValueError as err:
            raise ValueError("is not an http:// or https:// URL with a valid port") from err
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("is not an http:// or https:// URL")
        if parts.username is not None or parts.password is not None:
            raise ValueError("must not carry credentials: give the key with api_key_env or api_key_file")
        if parts.query or parts.fragment:
            raise ValueError("must have no query or fragment")
        tls = parts.scheme == "https"
        prefix = parts.path.rstrip("/") or DEFAULT_PREFIX
        return cls(tls, parts.hostname, port or (443 if tls else 80), prefix)

    @property
    def url(self) -> str:
        """The base URL, for log lines (never for client messages)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}{self.prefix}"


@dataclass(frozen=True)
class RemoteSettings:
    """A remote server's options: where it is, where its key is, which certificates to trust."""

    endpoint: Endpoint
    api_key_env: str | None = None
    api_key_file: Path | None = None
    ca_file: Path | None = None

    def api_key(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The key (``None`` when the server takes none); :class:`ValueError` names the option
        whose key is missing, never the key."""
        if self.api_key_env is not None:
            key = (os.environ if environ is None else environ).get(self.api_key_env, "").strip()
            if not key:
                raise ValueError(f"api_key_env: the environment variable {self.api_key_env} is not set")
            return key
        if self.api_key_file is not None:
            try:
                lines = self.api_key_file.read_text(encoding="utf-8").splitlines()
            except (OSError, UnicodeDecodeError) as err:
                raise ValueError("api_key_file: the file cannot be read") from err
            key = lines[0].strip() if lines else ""
            if not key:
                raise ValueError("api_key_file: the file's first line is empty")
            return key
        return None

    def tls_context(self) -> ssl.SSLContext | None:
        """The HTTPS context (``None`` for ``http://``): the system's trust store, or ``ca_file``."""
        if not self.endpoint.tls:
            return None
        try:
            return ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file is not None else None)
        except (OSError, ssl.SSLError) as err:
            raise ValueError("ca_file: the file holds no PEM certificate that can be loaded") from err


def _string(options: Mapping[str, JsonValue], name: str) -> str | None:
    value = options.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string")
    return value.strip()


def _parsed(options: Mapping[str, JsonValue], extra: Iterable[str]) -> dict[str, str | None]:
    unknown = sorted(set(options) - set(OPTIONS) - set(extra))
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)} (known: {', '.join((*OPTIONS, *extra))})")
    values = {name: _string(options, name) for name in OPTIONS}
    if values["endpoint"] is not None:
        try:
            Endpoint.parse(values["endpoint"])
        except ValueError as err:
            raise ValueError(f"endpoint {err}") from None
    env = values["api_key_env"]
    if env is not None and (env[0].isdigit() or not set(env) <= _ENV_NAME):
        raise ValueError("api_key_env must name an environment variable")
    if env is not None and values["api_key_file"] is not None:
        raise ValueError("give api_key_env or api_key_file, not both")
    return values


def remote_settings(options: Mapping[str, JsonValue], *, extra: Iterable[str] = ()) -> RemoteSettings:
    """The settings in a plugin's backend options (``config.backend_options[<plugin>]``);
    ``extra`` names the plugin's own options, allowed beside :data:`OPTIONS`. Raises
    :class:`ValueError` naming the option at fault, ``endpoint`` included when it is missing."""
    values = _parsed(options, extra)
    endpoint = values["endpoint"]
    if endpoint is None:
        raise ValueError("endpoint is missing: a remote instance needs endpoint = URL (docs/deployments.md)")
    key_file, ca_file = values["api_key_file"], values["ca_file"]
    return RemoteSettings(
        Endpoint.parse(endpoint),
        values["api_key_env"],
        Path(key_file).expanduser() if key_file is not None else None,
        Path(ca_file).expanduser() if ca_file is not None else None,
    )


def check_options(options: Mapping[str, JsonValue], *, extra: Iterable[str] = ()) -> None:
    """A factory's ``validate_options`` for :data:`OPTIONS`: it gets the instance's own options
    (docs/plugin-kit.md, "Options"), so an ``endpoint`` that may come from a server-wide
    ``--backend-option`` is not required; given, the key it names must be there now."""
    values = _parsed(options, extra)
    if values["endpoint"] is not None:
        settings = remote_settings(options, extra=extra)
        settings.api_key()
        settings.tls_context()


class Failure(StrEnum):
    """Why a server could not be used, each with the reason a client reads."""

    REFUSED = "refused"
    UNREACHABLE = "unreachable"
    TIMEOUT = "timeout"
    TLS = "tls"
    KEY = "key"
    STATUS = "status"
    NOT_OPENAI = "not_openai"
    MODEL = "model"


def classify(err: BaseException) -> tuple[Failure, str]:
    """The failure a connection error (or one it was raised from) is, with its detail."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return Failure.REFUSED, "the connection was refused"
        if isinstance(seen, ssl.SSLCertVerificationError):
            return Failure.TLS, "its TLS certificate is not trusted"
        if isinstance(seen, ssl.SSLError):
            return Failure.TLS, "the TLS handshake failed"
        if isinstance(seen, socket.gaierror):
            return Failure.UNREACHABLE, "its host name does not resolve"
        if isinstance(seen, TimeoutError):
            return Failure.TIMEOUT, "it did not answer in time"
        if isinstance(seen, ConnectionError | http.client.HTTPException):
            return Failure.UNREACHABLE, "the connection broke"
        if isinstance(seen, OSError):
            return Failure.UNREACHABLE, "the network failed"
        seen = seen.__cause__
    return Failure.UNREACHABLE, "it could not be reached"


@dataclass(frozen=True)
class Probe:
    """A probe's outcome: the served model ids, or the failure with its detail."""

    models: tuple[str, ...] = ()
    failure: Failure | None = None
    detail: str = ""
    at: float = 0.0

    @property
    def ok(self) -> bool:
        return self.failure is None


class Remote:
    """One remote server (see the module docstring). Thread-safe.

    ``label`` starts every message (``"the upstream for model m"``); ``key_hint`` says where the
    key comes from in the key-refused message (``"api_key_env UPSTREAM_KEY"``). ``bounds`` are
    the host's backend bounds (``config.backend_bounds``)."""

    def __init__(
        self,
        settings: RemoteSettings,
        *,
        label: str = "the upstream",
        bounds: BackendBounds | None = None,
        environ: Mapping[str, str] | None = None,
        size: int = 16,
    ) -> None:
        self.settings = settings
        self.label = label
        endpoint = settings.endpoint
        key = settings.api_key(environ)
        self.pool = ConnectionPool(
            endpoint.host,
            endpoint.port,
            size=size,
            api_key=key,
            label=label,
            bounds=bounds,
            tls=settings.tls_context(),
            prefix=endpoint.prefix,
        )
        self._lock = threading.Lock()
        self._last: Probe | None = None

    @property
    def key_hint(self) -> str:
        if self.settings.api_key_env is not None:
            return f"api_key_env {self.settings.api_key_env}"
        return "api_key_file" if self.settings.api_key_file is not None else "no key is configured"

    @property
    def last(self) -> Probe | None:
        """The last probe (or failed request), ``None`` before the first."""
        with self._lock:
            return self._last

    def _record(self, probe: Probe) -> Probe:
        with self._lock:
            self._last = probe
        if not probe.ok:
            log.warning("%s at %s: %s (%s)", self.label, self.settings.endpoint.url, probe.failure, probe.detail)
        return probe

    def probe(self, model: str | None = None, *, timeout: float = PROBE_TIMEOUT_S) -> Probe:
        """``GET <prefix>/models`` on a fresh connection: the served ids, or why not. With
        ``model``, a server listing models but not that one is :attr:`Failure.MODEL`."""
        now = time.monotonic()
        conn = self.pool.connection(timeout)
        try:
            conn.request("GET", self.pool.prefix + "/models", headers=dict(self.pool.auth_headers))
            response = conn.getresponse()
            raw = response.read(1 << 20)
        except (OSError, http.client.HTTPException) as err:
            failure, detail = classify(err)
            return self._record(Probe(failure=failure, detail=detail, at=now))
        finally:
            conn.close()
        if response.status in (401, 403):
            return self._record(Probe(failure=Failure.KEY, detail=f"status {response.status}", at=now))
        if response.status != 200:
            return self._record(Probe(failure=Failure.STATUS, detail=f"status {response.status}", at=now))
        models = _model_ids(raw)
        if models is None:
            return self._record(Probe(failure=Failure.NOT_OPENAI, detail="no OpenAI model list", at=now))
        if model is not None and models and model not in models:
            log.warning("%s serves %s, not %s", self.label, ", ".join(models[:8]), model)
            return self._record(Probe(models, Failure.MODEL, model, at=now))
        return self._record(Probe(models, at=now))

    def error(self, probe: Probe) -> WerkError:
        """The ``unavailable`` a failed probe is, naming the reason (never the key or the URL)."""
        reasons = {
            Failure.REFUSED: f"{self.label} is not answering ({probe.detail})",
            Failure.UNREACHABLE: f"{self.label} is not answering ({probe.detail})",
            Failure.TIMEOUT: f"{self.label} is not answering ({probe.detail})",
            Failure.TLS: f"{self.label} cannot be reached over TLS ({probe.detail})",
            Failure.KEY: f"{self.label} refused the API key ({self.key_hint})",
            Failure.STATUS: f"{self.label} failed ({probe.detail})",
            Failure.NOT_OPENAI: f"{self.label} does not answer as an OpenAI-compatible server",
            Failure.MODEL: f"{self.label} does not serve a model named {probe.detail}",
        }
        assert probe.failure is not None
        retryable = probe.failure not in (Failure.KEY, Failure.MODEL, Failure.NOT_OPENAI, Failure.TLS)
        return WerkError(ErrorCode.UNAVAILABLE, reasons[probe.failure], retryable=retryable)

    def ready(self, model: str | None = None, *, retry_s: float = RETRY_S) -> None:
        """Return when the server answered its last probe; probe when there was none or when a
        failed one is older than ``retry_s``; else raise the failure (:meth:`error`)."""
        last = self.last
        if last is None or (not last.ok and time.monotonic() - last.at >= retry_s):
            last = self.probe(model)
        if not last.ok:
            raise self.error(last)

    def forward(self, path: str, body: dict[str, Any]) -> InferenceResponse:
        """:func:`~werk_host.plugin.http.forward` to ``<prefix><path>``, with the failures named:
        a connection failure, a refused key (401, 403) and a server error (5xx) raise an
        ``unavailable`` with the reason and are recorded as a failed probe; other statuses
        are relayed (the host answers them in its own words)."""
        now = time.monotonic()
        try:
            response = forward(self.pool, path, body)
        except ClientGone:
            raise
        except WerkError as err:
            if err.__cause__ is None:  # a bound ran out: the host's own message says which
                raise
            failure, detail = classify(err)
            raise self.error(self._record(Probe(failure=failure, detail=detail, at=now))) from err
        status = response.status
        if status in (401, 403) or status >= 500:
            response.close()
            kind = Failure.KEY if status < 500 else Failure.STATUS
            raise self.error(self._record(Probe(failure=kind, detail=f"status {status}", at=now)))
        return response

    def close(self) -> None:
        self.pool.close()

    def __repr__(self) -> str:
        return f"<Remote {self.label} {self.settings.endpoint.url}>"


def _model_ids(raw: bytes) -> tuple[str, ...] | None:
    """The ids of an OpenAI ``/models`` answer (``{"data": [{"id": ...}, ...]}``), else ``None``."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        return None
    return tuple(str(e["id"]) for e in data if isinstance(e, dict) and isinstance(e.get("id"), str))
