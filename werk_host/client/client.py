"""``WerkProtocolClient``: typed methods for every ``/werk/v1`` route, the job routes'
result files, and OpenAI's ``/v1/chat/completions`` (:meth:`WerkProtocolClient.chat`, whose
answer is OpenAI's object and whose errors are the same typed errors; docs/comfyui.md uses it).

The client talks to one explicit ``http://HOST:PORT`` (no TLS; loopback or a trusted
private hop), sends ``Accept: application/json`` and ``X-Werk-Protocol-Version: 1.0``,
never follows redirects, bounds requests at 1 MiB and responses at 8 MiB, and validates
the response envelope before any payload is returned:

* the body must be one JSON object ``{"protocol", "request_id", "data"|"error"}``;
* ``protocol.major`` must equal the client's major and ``protocol.minor`` must not be
  newer than the client's minor (:class:`IncompatibleVersionError` otherwise);
* an ``X-Werk-Protocol-Version`` response header, when present, must agree with the
  envelope (:class:`VersionHeaderMismatchError`); a missing header is accepted;
* an ``X-Werk-Request-Id`` header, when present, must repeat the envelope's request id;
* a protocol error envelope raises the :class:`WerkApiError` subclass for its code.

The API key is held as a :class:`pydantic.SecretStr`; neither ``repr(client)`` nor any
raised error contains it or a handoff.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any, Final, TypeVar
from urllib.parse import quote, urlencode

from pydantic import BaseModel, SecretStr, TypeAdapter, ValidationError

from werk_host import __version__
from werk_host.client.envelope import Answer, open_envelope, open_openai
from werk_host.client.errors import (
    ClientConfigError,
    ProtocolViolationError,
    RequestTooLargeError,
    WerkClientError,
)
from werk_host.client.transport import Endpoint, RawResponse, exchange, parse_base_url
from werk_host.protocol import (
    DEFAULT_OUTPUT_TOKENS,
    MAX_REQUEST_BYTES,
    PROTOCOL_MAJOR,
    PROTOCOL_MINOR,
    Admission,
    Capability,
    CapabilityId,
    ChatLimits,
    ChatRequest,
    DecodeRequest,
    DecodeResult,
    DeploymentActionRequest,
    DeploymentActionResult,
    DeploymentLogs,
    Deployments,
    ExpertActionRequest,
    ExpertActionResult,
    ExpertListQuery,
    ExpertPage,
    JobCreate,
    JobView,
    MemoryReport,
    Observability,
    PrefillRequest,
    PrefillResult,
    PruneRequest,
    PruneResult,
    ReasoningProfile,
    RuntimeInfo,
    StateActionRequest,
    StateActionResult,
    StateListQuery,
    StatePage,
    TokenCount,
)

log = logging.getLogger("werk_host.client")

T = TypeVar("T")

DEFAULT_SERVER: Final = "http://127.0.0.1:11434"
DEFAULT_TIMEOUT: Final = 30.0
MAX_RESPONSE_BYTES: Final = 8 << 20
CLIENT_VERSION: Final = f"{PROTOCOL_MAJOR}.{PROTOCOL_MINOR}"
MAX_MESSAGE_CHARS: Final = 2048
#: A job's result file (an image or audio) may be larger than a JSON answer.
MAX_RESULT_BYTES: Final = 64 << 20
_REDACTED: Final = "[redacted]"

_CAPABILITIES: Final = TypeAdapter(list[Capability])


def _printable_token(value: object, limit: int) -> bool:
    return isinstance(value, str) and 1 <= len(value) <= limit and all(0x20 < ord(c) < 0x7F for c in value)


def _validation_summary(err: ValidationError) -> str:
    """Field locations and messages only: never the submitted or received values."""
    parts = []
    for item in err.errors(include_input=False, include_url=False, include_context=False)[:5]:
        loc = ".".join(str(p) for p in item.get("loc", ())) or "value"
        parts.append(f"{loc}: {item.get('msg', 'invalid')}")
    return "; ".join(parts)


class WerkProtocolClient:
    """A typed, bounded Werk Protocol 1.0 client. Stateless between calls and thread-safe.

    ``base_url`` must be ``http://HOST:PORT`` with an explicit port (a lone trailing ``/``
    is allowed). ``api_key`` is sent as ``Authorization: Bearer``; ``deployment`` (when set)
    is sent as ``X-Werk-Deployment`` on every request. ``timeout`` bounds each request as a
    whole (connect, send and receive).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        deployment: str | None = None,
    ) -> None:
        self._endpoint: Endpoint = parse_base_url(base_url)
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise ClientConfigError("timeout must be a positive, finite number of seconds")
        self._timeout = float(timeout)
        if api_key is not None and not _printable_token(api_key, 4096):
            raise ClientConfigError("the API key must be 1..4096 printable ASCII characters without spaces")
        self._api_key: SecretStr | None = SecretStr(api_key) if api_key is not None else None
        if deployment is not None and not _printable_token(deployment, 256):
            raise ClientConfigError("the deployment id must be 1..256 printable ASCII characters")
        self._deployment = deployment

    # -- identity ------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return self._endpoint.url

    @property
    def timeout(self) -> float:
        return self._timeout

    @property
    def has_api_key(self) -> bool:
        return self._api_key is not None

    def __repr__(self) -> str:
        key = "<set>" if self._api_key is not None else None
        return f"WerkProtocolClient(base_url={self.base_url!r}, api_key={key!r}, timeout={self._timeout!r})"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("WerkProtocolClient holds a secret and cannot be pickled")

    # -- discovery -----------------------------------------------------------------------
    def info(self) -> RuntimeInfo:
        """``GET /werk/v1/info``: service, active adapter and negotiated limits."""
        return self._call("GET", "/werk/v1/info", RuntimeInfo)

    def capabilities(self) -> list[Capability]:
        """``GET /werk/v1/capabilities``: the capability array (status is authoritative)."""
        answer = self._request("GET", "/werk/v1/capabilities")
        if isinstance(answer.data, list):  # ids this client does not know (a newer server's) are left out
            known = {c.value for c in CapabilityId}
            kept = [c for c in answer.data if not isinstance(c, dict) or c.get("id") in known]
            answer = Answer(kept, answer.request_id, answer.status)
        return self._convert(answer, _CAPABILITIES, "capabilities")

    def memory(self) -> MemoryReport:
        """``GET /werk/v1/memory``: memory telemetry and accounting."""
        return self._call("GET", "/werk/v1/memory", MemoryReport)

    def observability(self) -> Observability:
        """``GET /werk/v1/observability``: chat, worker and memory observations."""
        return self._call("GET", "/werk/v1/observability", Observability)

    def deployments(self) -> Deployments:
        """``GET /werk/v1/deployments``: deployment inventory, plans and slots."""
        return self._call("GET", "/werk/v1/deployments", Deployments)

    def deployment_action(self, instance_id: str, request: DeploymentActionRequest) -> DeploymentActionResult:
        """``POST /werk/v1/deployments/{id}/actions``: load, unload, pin or unpin (operator key)."""
        path = f"/werk/v1/deployments/{self._path_segment(instance_id, 'instance id')}/actions"
        return self._call("POST", path, DeploymentActionResult, body=self._body(request))

    def deployment_logs(self, instance_id: str, lines: int = 100) -> DeploymentLogs:
        """``GET /werk/v1/deployments/{id}/logs``: the instance's lifecycle log tail (operator key)."""
        path = f"/werk/v1/deployments/{self._path_segment(instance_id, 'instance id')}/logs"
        return self._call("GET", path, DeploymentLogs, params={"lines": str(lines)})

    # -- states --------------------------------------------------------------------------
    def list_states(self, query: StateListQuery | None = None) -> StatePage:
        """``GET /werk/v1/states``: one page of runtime states."""
        params = self._query(query or StateListQuery())
        return self._call("GET", "/werk/v1/states", StatePage, params=params)

    def state_action(self, state_id: str, request: StateActionRequest) -> StateActionResult:
        """``POST /werk/v1/states/{id}/actions``: pin, unpin, promote, demote or evict."""
        path = f"/werk/v1/states/{self._path_segment(state_id, 'state id')}/actions"
        return self._call("POST", path, StateActionResult, body=self._body(request))

    def prune_states(self, request: PruneRequest) -> PruneResult:
        """``POST /werk/v1/states/prune``: remove (or preview removing) selected states."""
        return self._call("POST", "/werk/v1/states/prune", PruneResult, body=self._body(request))

    # -- experts -------------------------------------------------------------------------
    def list_experts(self, query: ExpertListQuery | None = None) -> ExpertPage:
        """``GET /werk/v1/experts``: one page of expert metadata."""
        params = self._query(query or ExpertListQuery())
        return self._call("GET", "/werk/v1/experts", ExpertPage, params=params)

    def expert_action(self, request: ExpertActionRequest) -> ExpertActionResult:
        """``POST /werk/v1/experts/actions``: prefetch, pin, unpin or evict experts."""
        return self._call("POST", "/werk/v1/experts/actions", ExpertActionResult, body=self._body(request))

    # -- prefill / decode ----------------------------------------------------------------
    def prefill(self, request: PrefillRequest) -> PrefillResult:
        """``POST /werk/v1/prefill``; the result's ``handoff`` is a ``SecretStr``.

        Absent ``policy``/``allow_experimental`` members are omitted on the wire so that
        server-side persistence defaults can apply.
        """
        return self._call("POST", "/werk/v1/prefill", PrefillResult, body=self._body(request))

    def decode(self, request: DecodeRequest) -> DecodeResult:
        """``POST /werk/v1/decode``: consumes the handoff; a next handoff may be returned."""
        secret = request.handoff.get_secret_value()
        return self._call("POST", "/werk/v1/decode", DecodeResult, body=self._body(request), secrets=(secret,))

    # -- chat planning -------------------------------------------------------------------
    def count_tokens(self, request: ChatRequest) -> TokenCount:
        """``POST /werk/v1/chat/count_tokens``: exact native input token count."""
        return self._call("POST", "/werk/v1/chat/count_tokens", TokenCount, body=self._chat_body(request))

    def admission(self, request: ChatRequest) -> Admission:
        """``POST /werk/v1/chat/admission``: a planning budget (native or estimated count)."""
        return self._call("POST", "/werk/v1/chat/admission", Admission, body=self._chat_body(request))

    def chat_limits(self, model: str | None = None) -> ChatLimits:
        """``GET /werk/v1/chat/limits[?model=]``: context, output and concurrency limits."""
        params = {"model": model} if model is not None else {}
        return self._call("GET", "/werk/v1/chat/limits", ChatLimits, params=params)

    def reasoning(self, model: str | None = None, max_output_tokens: int = DEFAULT_OUTPUT_TOKENS) -> ReasoningProfile:
        """``GET /werk/v1/chat/reasoning``: tiers, default and effective limits."""
        if isinstance(max_output_tokens, bool) or not isinstance(max_output_tokens, int) or max_output_tokens < 1:
            raise ClientConfigError("max_output_tokens must be a positive integer")
        params: dict[str, str] = {"max_output_tokens": str(max_output_tokens)}
        if model is not None:
            params["model"] = model
        return self._call("GET", "/werk/v1/chat/reasoning", ReasoningProfile, params=params)

    # -- inference and jobs -------------------------------------------------------------
    def chat(self, request: ChatRequest) -> dict[str, Any]:
        """``POST /v1/chat/completions`` (not streamed): OpenAI's completion object, with Werk's
        chat options in ``request.werk`` (docs/compat.md). Its errors are the typed errors of
        Werk's code in OpenAI's ``error.code``."""
        if request.stream:
            raise ClientConfigError("chat() does not stream: leave stream unset")
        raw = self._exchange("POST", "/v1/chat/completions", body=self._chat_body(request))
        completion = open_openai(raw, lambda text: self._scrub(text, ()))
        choices = completion.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ProtocolViolationError("the chat completion has no choices", status=raw.status)
        return completion

    def create_job(self, request: JobCreate) -> JobView:
        """``POST /werk/v1/jobs``: an image or speech job, queued (202)."""
        body = self._encode(request.model_dump(mode="json", exclude_none=True))
        return self._call("POST", "/werk/v1/jobs", JobView, body=body)

    def job(self, job_id: str) -> JobView:
        """``GET /werk/v1/jobs/{id}``: one of the caller's jobs (another key's is ``not_found``)."""
        return self._call("GET", f"/werk/v1/jobs/{self._path_segment(job_id, 'job id')}", JobView)

    def cancel_job(self, job_id: str) -> JobView:
        """``POST /werk/v1/jobs/{id}/cancel``."""
        return self._call("POST", f"/werk/v1/jobs/{self._path_segment(job_id, 'job id')}/cancel", JobView)

    def job_result(self, job_id: str, name: str) -> tuple[bytes, str]:
        """``GET /werk/v1/jobs/{id}/result/{name}``: a result file's bytes and content type
        (bounded at :data:`MAX_RESULT_BYTES`)."""
        path = f"/werk/v1/jobs/{self._path_segment(job_id, 'job id')}/result/{self._path_segment(name, 'file name')}"
        raw = self._exchange("GET", path, max_response_bytes=MAX_RESULT_BYTES)
        if not 200 <= raw.status < 300:
            open_envelope(raw, lambda text: self._scrub(text, ()))  # raises the typed error
            raise ProtocolViolationError(f"HTTP {raw.status} without an error envelope", status=raw.status)
        return raw.body, raw.single("Content-Type") or "application/octet-stream"

    # -- plumbing ------------------------------------------------------------------------
    @staticmethod
    def _path_segment(value: str, what: str) -> str:
        if not isinstance(value, str) or not 1 <= len(value) <= 256 or value in (".", ".."):
            raise ClientConfigError(f"invalid {what}")
        if any(not (c.isascii() and (c.isalnum() or c in "-._~")) for c in value):
            raise ClientConfigError(f"invalid {what}: only letters, digits and -._~ are allowed")
        return quote(value, safe="")

    @staticmethod
    def _query(query: BaseModel) -> dict[str, str]:
        params: dict[str, str] = {}
        for name, value in query.model_dump(mode="json", exclude_none=True).items():
            params[name] = ("true" if value else "false") if isinstance(value, bool) else str(value)
        return params

    @staticmethod
    def _body(request: BaseModel) -> bytes:
        return WerkProtocolClient._encode(request.model_dump(mode="json", exclude_none=True))

    @staticmethod
    def _chat_body(request: ChatRequest) -> bytes:
        return WerkProtocolClient._encode(request.model_dump(mode="json", exclude_unset=True))

    @staticmethod
    def _encode(payload: Any) -> bytes:
        try:
            body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
        except ValueError:  # NaN/Infinity, or a lone surrogate that UTF-8 cannot encode
            raise ClientConfigError("the request is not encodable as strict UTF-8 JSON") from None
        if len(body) > MAX_REQUEST_BYTES:
            raise RequestTooLargeError(f"the encoded request ({len(body)} bytes) exceeds {MAX_REQUEST_BYTES} bytes")
        return body

    def _call(
        self,
        method: str,
        path: str,
        model: type[T],
        *,
        params: dict[str, str] | None = None,
        body: bytes | None = None,
        secrets: tuple[str, ...] = (),
    ) -> T:
        answer = self._request(method, path, params=params, body=body, secrets=secrets)
        return self._convert(answer, TypeAdapter(model), model.__name__)

    @staticmethod
    def _convert(answer: Answer, adapter: TypeAdapter[T], name: str) -> T:
        try:
            return adapter.validate_python(answer.data)
        except ValidationError as err:
            raise ProtocolViolationError(
                f"the response data is not a valid {name}: {_validation_summary(err)}",
                status=answer.status,
                request_id=answer.request_id,
            ) from None

    def _scrub(self, text: str, secrets: tuple[str, ...]) -> str:
        hidden = [s for s in secrets if s]
        if self._api_key is not None:
            hidden.append(self._api_key.get_secret_value())
        for secret in sorted(hidden, key=len, reverse=True):
            text = text.replace(secret, _REDACTED)
        text = "".join(c if c.isprintable() else " " for c in text)
        return text[:MAX_MESSAGE_CHARS]

    def _exchange(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: bytes | None = None,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ) -> RawResponse:
        target = path + (f"?{urlencode(params, quote_via=quote)}" if params else "")
        headers = [
            ("Accept", "application/json"),
            ("X-Werk-Protocol-Version", CLIENT_VERSION),
            ("User-Agent", f"werk-host-client/{__version__}"),
        ]
        if self._api_key is not None:
            headers.append(("Authorization", f"Bearer {self._api_key.get_secret_value()}"))
        if self._deployment is not None:
            headers.append(("X-Werk-Deployment", self._deployment))
        if body is not None:
            headers.append(("Content-Type", "application/json"))
        try:
            return exchange(
                self._endpoint,
                method,
                target,
                headers,
                body,
                timeout=self._timeout,
                max_response_bytes=max_response_bytes,
            )
        except WerkClientError as err:
            log.debug("%s %s failed: %s", method, path, err.code)
            raise

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: bytes | None = None,
        secrets: tuple[str, ...] = (),
    ) -> Answer:
        raw = self._exchange(method, path, params=params, body=body)
        try:
            data = open_envelope(raw, lambda text: self._scrub(text, secrets))
        except WerkClientError as err:
            log.debug("%s %s -> %s (%s, request %s)", method, path, raw.status, err.code, err.request_id)
            raise
        log.debug("%s %s -> %s (request %s)", method, path, raw.status, data.request_id)
        return data
