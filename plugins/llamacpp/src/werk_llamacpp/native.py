"""A small typed HTTP client for one managed ``llama-server`` child.

Standard library only (``http.client``) with one persistent keep-alive
connection per client, guarded by a lock, so a client may be shared between
threads (requests are then serialized). Create one client per concurrent
caller when parallel requests are wanted.

With ``api_key``, every request carries ``Authorization: Bearer <key>`` (the
managed child answers 401 to anything else but ``/health``); the key is never
part of a repr or an error message.

Every transport failure (connection refused, reset, server killed mid-request,
timeout) raises :class:`NativeConnectionError`; every non-2xx answer raises
:class:`NativeHTTPError` carrying the status and llama-server's error message.

Generated text is bytes-safe: llama-server replaces invalid UTF-8 with U+FFFD
when it serializes JSON, and this client decodes response bodies with
``errors="replace"`` as a second guard, so random-weight output never raises.

See ``NATIVE_NOTES.md`` next to this distribution for the exact counters the
server reports for slot save/restore/erase and for a replay after restore.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

__all__ = [
    "Completion",
    "InvalidSlotError",
    "LlamaServerClient",
    "NativeConnectionError",
    "NativeError",
    "NativeHTTPError",
    "NativePersistenceOff",
    "SlotErase",
    "SlotInfo",
    "SlotRestore",
    "SlotSave",
]

JSONDict = dict[str, Any]


class NativeError(Exception):
    """Base class for errors talking to llama-server."""

    def __init__(self, message: str, *, endpoint: str) -> None:
        super().__init__(message)
        self.endpoint = endpoint


class InvalidSlotError(ValueError):
    """A slot id outside ``0..n_slots-1`` (llama-server itself would silently wrap it modulo the slot count)."""


class NativeConnectionError(NativeError):
    """The request did not get a complete HTTP answer (refused, reset, killed, timed out)."""


class NativePersistenceOff(NativeError):
    """A slot save or restore refused before anything was sent: native persistence is off for
    this child (its executable changed since it was inspected: :class:`werk_llamacpp.binary.ExecutableCheck`)."""


class NativeHTTPError(NativeError):
    """llama-server answered with a non-2xx status."""

    def __init__(self, message: str, *, endpoint: str, status: int, body: str, error_type: str | None) -> None:
        super().__init__(message, endpoint=endpoint)
        self.status = status
        self.body = body
        self.error_type = error_type


def _opt_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _opt_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    return None


@dataclass(frozen=True)
class Completion:
    """Result of ``POST /completion`` (non-streaming).

    Counters (all from the server, ``None`` when absent):

    * ``tokens_evaluated`` – prompt tokens of this request (cached + processed)
    * ``tokens_cached`` – tokens held in the slot after the request (prompt + generated)
    * ``cache_n`` – prompt tokens reused from the slot's KV cache (``timings.cache_n``)
    * ``prompt_n`` – prompt tokens actually computed by this request (``timings.prompt_n``)
    * ``predicted_n`` – generated tokens (``timings.predicted_n``)
    """

    content: str
    stop_type: str | None
    stopping_word: str | None
    truncated: bool
    id_slot: int | None
    tokens: list[int]
    tokens_evaluated: int | None
    tokens_cached: int | None
    cache_n: int | None
    prompt_n: int | None
    predicted_n: int | None
    prompt_ms: float | None
    predicted_ms: float | None
    raw: JSONDict = field(repr=False, compare=False)

    @property
    def finish_reason(self) -> str | None:
        """OpenAI-style finish reason: ``stop`` (EOS or stop word), ``length`` (n_predict), else ``None``."""
        if self.stop_type in ("eos", "word"):
            return "stop"
        if self.stop_type == "limit":
            return "length"
        return None

    @classmethod
    def from_json(cls, data: JSONDict) -> Completion:
        timings = data.get("timings")
        t: Mapping[str, Any] = timings if isinstance(timings, dict) else {}
        toks = data.get("tokens")
        word = data.get("stopping_word")
        return cls(
            content=str(data.get("content", "")),
            stop_type=str(data["stop_type"]) if isinstance(data.get("stop_type"), str) else None,
            stopping_word=word if isinstance(word, str) and word else None,
            truncated=bool(data.get("truncated", False)),
            id_slot=_opt_int(data.get("id_slot")),
            tokens=[int(x) for x in toks] if isinstance(toks, list) else [],
            tokens_evaluated=_opt_int(data.get("tokens_evaluated")),
            tokens_cached=_opt_int(data.get("tokens_cached")),
            cache_n=_opt_int(t.get("cache_n")),
            prompt_n=_opt_int(t.get("prompt_n")),
            predicted_n=_opt_int(t.get("predicted_n")),
            prompt_ms=_opt_float(t.get("prompt_ms")),
            predicted_ms=_opt_float(t.get("predicted_ms")),
            raw=data,
        )


@dataclass(frozen=True)
class SlotSave:
    """``POST /slots/{id}?action=save``: ``n_saved`` tokens, ``n_written`` bytes."""

    id_slot: int
    filename: str
    n_saved: int
    n_written: int
    save_ms: float | None
    raw: JSONDict = field(repr=False, compare=False)


@dataclass(frozen=True)
class SlotRestore:
    """``POST /slots/{id}?action=restore``: ``n_restored`` tokens, ``n_read`` bytes."""

    id_slot: int
    filename: str
    n_restored: int
    n_read: int
    restore_ms: float | None
    raw: JSONDict = field(repr=False, compare=False)


@dataclass(frozen=True)
class SlotErase:
    """``POST /slots/{id}?action=erase``: ``n_erased`` tokens dropped from the slot."""

    id_slot: int
    n_erased: int
    raw: JSONDict = field(repr=False, compare=False)


@dataclass(frozen=True)
class SlotInfo:
    """One entry of ``GET /slots``."""

    id: int
    n_ctx: int | None
    is_processing: bool
    raw: JSONDict = field(repr=False, compare=False)


def _require_int(data: JSONDict, key: str, endpoint: str) -> int:
    value = _opt_int(data.get(key))
    if value is None:
        raise NativeError(f"llama-server answer lacks integer {key!r}: {data!r}", endpoint=endpoint)
    return value


class LlamaServerClient:
    """Typed client for one llama-server at ``host:port``.

    llama-server does not range-check slot ids: it maps ``id_slot`` modulo the
    slot count (``/slots/3?action=erase`` on a 2-slot server erases slot 1).
    Pass ``n_slots`` and the client refuses ids outside ``0..n_slots-1`` (and
    any negative id other than ``-1`` = "any idle slot" for completions) with
    :class:`InvalidSlotError` before sending anything.

    ``api_key`` authenticates every request (``Authorization: Bearer``). ``persistence``, when
    given, is called before every slot save and restore and raises
    :class:`NativePersistenceOff` when they may not run.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        timeout: float = 120.0,
        n_slots: int | None = None,
        api_key: str | None = None,
        persistence: Callable[[], None] | None = None,
    ) -> None:
        self.host = host
        self._persistence = persistence
        self.port = port
        self.timeout = timeout
        self.n_slots = n_slots
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    def check_slot(self, id_slot: int, *, allow_any: bool = False) -> int:
        """Return ``id_slot`` if valid for this server, else raise :class:`InvalidSlotError`."""
        if allow_any and id_slot == -1:
            return id_slot
        if id_slot < 0 or (self.n_slots is not None and id_slot >= self.n_slots):
            limit = f"0..{self.n_slots - 1}" if self.n_slots is not None else "a non-negative id"
            raise InvalidSlotError(f"slot id {id_slot} is not {limit}")
        return id_slot

    # -- transport ---------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def close(self) -> None:
        with self._lock:
            self._drop()

    def __repr__(self) -> str:
        return f"<LlamaServerClient {self.base_url}>"

    def __enter__(self) -> LlamaServerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> tuple[int, bytes]:
        """Send one request and return ``(status, body bytes)``; transport failures raise."""
        payload = None if body is None else json.dumps(body, ensure_ascii=False).encode("utf-8")
        headers = {"Accept": "application/json", **self._auth}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        with self._lock:
            for attempt in (0, 1):
                reused = self._conn is not None
                if self._conn is None:
                    self._conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout)
                conn = self._conn
                if conn.sock is not None:
                    conn.sock.settimeout(timeout or self.timeout)
                else:
                    conn.timeout = timeout or self.timeout
                try:
                    conn.request(method, path, body=payload, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                    self._drop()
                    # A kept-alive connection the server already closed: the request never
                    # reached it, so one retry on a fresh connection is safe.
                    if reused and attempt == 0:
                        continue
                    raise NativeConnectionError(f"{method} {path}: {exc!r}", endpoint=path) from exc
                except (OSError, http.client.HTTPException) as exc:
                    self._drop()
                    kind = "timed out" if isinstance(exc, socket.timeout | TimeoutError) else repr(exc)
                    raise NativeConnectionError(f"{method} {path}: {kind}", endpoint=path) from exc
                if resp.will_close:
                    self._drop()
                return resp.status, data
        raise AssertionError("unreachable")  # pragma: no cover

    def _json(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> Any:
        status, data = self.request(method, path, body, timeout=timeout)
        text = data.decode("utf-8", errors="replace")
        try:
            parsed: Any = json.loads(text) if text.strip() else None
        except json.JSONDecodeError:
            parsed = None
        if not 200 <= status < 300:
            message = text.strip()
            error_type: str | None = None
            if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
                err = parsed["error"]
                message = str(err.get("message", message))
                error_type = str(err["type"]) if "type" in err else None
            raise NativeHTTPError(
                f"{method} {path} -> HTTP {status}: {message}",
                endpoint=path,
                status=status,
                body=text,
                error_type=error_type,
            )
        if parsed is None and text.strip():
            raise NativeError(f"{method} {path}: answer is not JSON: {text[:200]!r}", endpoint=path)
        return parsed

    def _json_dict(
        self, method: str, path: str, body: Mapping[str, Any] | None = None, *, timeout: float | None = None
    ) -> JSONDict:
        parsed = self._json(method, path, body, timeout=timeout)
        if not isinstance(parsed, dict):
            raise NativeError(f"{method} {path}: expected a JSON object, got {parsed!r:.200}", endpoint=path)
        return parsed

    # -- endpoints -----------------------------------------------------------------

    def health(self, *, timeout: float = 2.0) -> bool:
        """``GET /health``: True when the model is loaded (HTTP 200); False while loading (503)."""
        status, _ = self.request("GET", "/health", timeout=timeout)
        return status == 200

    def props(self) -> JSONDict:
        """``GET /props``: server/model properties (``default_generation_settings``, ``total_slots``, ...)."""
        return self._json_dict("GET", "/props")

    def metrics(self) -> str:
        """``GET /metrics`` (Prometheus text); only served when llama-server runs with ``--metrics``."""
        status, data = self.request("GET", "/metrics")
        if status != 200:
            raise NativeHTTPError(
                f"GET /metrics -> HTTP {status}",
                endpoint="/metrics",
                status=status,
                body=data.decode("utf-8", errors="replace"),
                error_type=None,
            )
        return data.decode("utf-8", errors="replace")

    def apply_template(self, messages: Sequence[Mapping[str, Any]], **extra: Any) -> str:
        """``POST /apply-template``: render chat messages with the model's template (no inference)."""
        body: JSONDict = {"messages": [dict(m) for m in messages], **extra}
        data = self._json_dict("POST", "/apply-template", body)
        prompt = data.get("prompt")
        if not isinstance(prompt, str):
            raise NativeError(f"/apply-template answer lacks 'prompt': {data!r:.200}", endpoint="/apply-template")
        return prompt

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """``POST /tokenize``: token ids of ``text``."""
        data = self._json_dict(
            "POST", "/tokenize", {"content": text, "add_special": add_special, "parse_special": parse_special}
        )
        toks = data.get("tokens")
        if not isinstance(toks, list):
            raise NativeError(f"/tokenize answer lacks 'tokens': {data!r:.200}", endpoint="/tokenize")
        return [int(t["id"]) if isinstance(t, dict) else int(t) for t in toks]

    def detokenize(self, tokens: Sequence[int]) -> str:
        """``POST /detokenize``: text of ``tokens`` (invalid UTF-8 comes back as U+FFFD)."""
        data = self._json_dict("POST", "/detokenize", {"tokens": list(tokens)})
        return str(data.get("content", ""))

    def completion(
        self,
        prompt: str | Sequence[int],
        *,
        id_slot: int = -1,
        n_predict: int = -1,
        cache_prompt: bool = True,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        seed: int | None = None,
        stop: Sequence[str] | None = None,
        return_tokens: bool = False,
        timeout: float | None = None,
        **extra: Any,
    ) -> Completion:
        """``POST /completion`` (non-streaming) pinned to ``id_slot`` (``-1``: any idle slot).

        ``prompt`` is text (BOS added per the model's metadata) or a token id list
        (taken verbatim). ``n_predict=0`` only evaluates the prompt into the slot.
        ``extra`` passes further native options (``ignore_eos``, ``n_probs``, ...).
        """
        body: JSONDict = {
            "prompt": prompt if isinstance(prompt, str) else [int(t) for t in prompt],
            "id_slot": self.check_slot(id_slot, allow_any=True),
            "n_predict": n_predict,
            "cache_prompt": cache_prompt,
            "stream": False,
        }
        if temperature is not None:
            body["temperature"] = temperature
        if top_p is not None:
            body["top_p"] = top_p
        if top_k is not None:
            body["top_k"] = top_k
        if seed is not None:
            body["seed"] = seed
        if stop is not None:
            body["stop"] = list(stop)
        if return_tokens:
            body["return_tokens"] = True
        body.update(extra)
        return Completion.from_json(self._json_dict("POST", "/completion", body, timeout=timeout))

    def slots(self) -> list[SlotInfo]:
        """``GET /slots``: per-slot state (requires the server's slots endpoint to be enabled)."""
        data = self._json("GET", "/slots")
        if not isinstance(data, list):
            raise NativeError(f"/slots answer is not a list: {data!r:.200}", endpoint="/slots")
        out: list[SlotInfo] = []
        for item in data:
            if not isinstance(item, dict):
                continue
            sid = _opt_int(item.get("id"))
            if sid is None:
                continue
            out.append(
                SlotInfo(
                    id=sid,
                    n_ctx=_opt_int(item.get("n_ctx")),
                    is_processing=bool(item.get("is_processing", False)),
                    raw=item,
                )
            )
        return out

    def _slot_action(
        self, id_slot: int, action: str, body: Mapping[str, Any] | None, timeout: float | None = None
    ) -> tuple[str, JSONDict]:
        path = f"/slots/{self.check_slot(int(id_slot))}?action={quote(action)}"
        if action != "erase" and self._persistence is not None:
            self._persistence()
        return path, self._json_dict("POST", path, body if body is not None else {}, timeout=timeout)

    def slot_save(self, id_slot: int, filename: str) -> SlotSave:
        """Save the slot's KV state to ``<slot-save-path>/<filename>``."""
        path, data = self._slot_action(id_slot, "save", {"filename": filename})
        timings = data.get("timings")
        return SlotSave(
            id_slot=_require_int(data, "id_slot", path),
            filename=str(data.get("filename", filename)),
            n_saved=_require_int(data, "n_saved", path),
            n_written=_require_int(data, "n_written", path),
            save_ms=_opt_float(timings.get("save_ms")) if isinstance(timings, dict) else None,
            raw=data,
        )

    def slot_restore(self, id_slot: int, filename: str) -> SlotRestore:
        """Restore the slot's KV state from ``<slot-save-path>/<filename>``."""
        path, data = self._slot_action(id_slot, "restore", {"filename": filename})
        timings = data.get("timings")
        return SlotRestore(
            id_slot=_require_int(data, "id_slot", path),
            filename=str(data.get("filename", filename)),
            n_restored=_require_int(data, "n_restored", path),
            n_read=_require_int(data, "n_read", path),
            restore_ms=_opt_float(timings.get("restore_ms")) if isinstance(timings, dict) else None,
            raw=data,
        )

    def slot_erase(self, id_slot: int, *, timeout: float | None = None) -> SlotErase:
        """Drop the slot's cached prompt/KV state. An erase writes nothing to disk: callers on a
        request's path bound it by ``--backend-timeout`` (``timeout``), not the client's own."""
        path, data = self._slot_action(id_slot, "erase", None, timeout)
        return SlotErase(
            id_slot=_require_int(data, "id_slot", path),
            n_erased=_require_int(data, "n_erased", path),
            raw=data,
        )
