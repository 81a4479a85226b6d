"""``chat`` (OpenAI's ``/v1/chat/completions``) and ``job_result`` (raw bytes) on the wire:
what is sent, OpenAI errors as the typed errors by Werk's code (or by status), the key
scrubbed, non-JSON refused, a result's bytes and type, a result error's envelope."""

from __future__ import annotations

import json

import pytest

from tests.client.rawserver import error_envelope, http, raw_server
from werk_host.client import (
    InvalidRequestError,
    NotFoundError,
    ProtocolViolationError,
    ResourceExhaustedError,
    UnauthorizedError,
    WerkProtocolClient,
)
from werk_host.errors import ErrorCode
from werk_host.protocol import ChatMessage, ChatRequest

KEY = "sk-chat-jobs-wire-0123456789"
REQUEST = ChatRequest(
    messages=[ChatMessage(role="user", content="hi")], max_tokens=4, werk={"reasoning": {"tier": "low"}}
)
COMPLETION = {
    "id": "c1",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "yo"}}],
}


def _openai_error(message: str, code: str | None) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    ).encode()


def test_chat_posts_the_request_with_werk_s_member_and_returns_openai_s_object() -> None:
    with raw_server(http(json.dumps(COMPLETION).encode(), version_header=None)) as srv:
        answer = WerkProtocolClient(srv.url, KEY).chat(REQUEST)
    assert answer == COMPLETION
    sent = srv.requests[0]
    assert (sent.method, sent.target) == ("POST", "/v1/chat/completions")
    assert sent.json()["werk"] == {"reasoning": {"tier": "low"}} and sent.headers["authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        ("400 Bad Request", "invalid_request", InvalidRequestError),
        ("401 Unauthorized", "unauthorized", UnauthorizedError),
        ("400 Bad Request", "context_length_exceeded", InvalidRequestError),  # OpenAI's own code: by status
        ("404 Not Found", None, NotFoundError),
        ("429 Too Many Requests", "resource_exhausted", ResourceExhaustedError),
    ],
)
def test_openai_errors_are_the_typed_errors_with_the_key_scrubbed(
    status: str, code: str | None, expected: type
) -> None:
    answer = http(_openai_error(f"no for {KEY}", code), status=status, version_header=None)
    with raw_server(answer) as srv, pytest.raises(expected) as caught:
        WerkProtocolClient(srv.url, KEY).chat(REQUEST)
    assert KEY not in str(caught.value) and "[redacted]" in str(caught.value)
    assert caught.value.retryable is (expected is ResourceExhaustedError)


@pytest.mark.parametrize("body", [b"<html>", b"[1]", json.dumps({"choices": []}).encode()])
def test_a_chat_answer_that_is_not_a_completion_is_a_violation(body: bytes) -> None:
    with raw_server(http(body, version_header=None)) as srv, pytest.raises(ProtocolViolationError):
        WerkProtocolClient(srv.url, KEY).chat(REQUEST)


def test_a_job_result_is_its_bytes_and_type_and_its_error_the_envelope_s() -> None:
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 64
    with raw_server(http(png, content_type="image/png")) as srv:
        assert WerkProtocolClient(srv.url, KEY).job_result("job_1", "image-0.png") == (png, "image/png")
    assert srv.requests[0].target == "/werk/v1/jobs/job_1/result/image-0.png"
    missing = http(error_envelope(ErrorCode.NOT_FOUND, "no such job"), status="404 Not Found")
    with raw_server(missing) as srv, pytest.raises(NotFoundError):
        WerkProtocolClient(srv.url, KEY).job_result("job_1", "image-0.png")
    with pytest.raises(Exception, match="file name"):
        WerkProtocolClient("http://127.0.0.1:9", KEY).job_result("job_1", "../x")
