"""Hostile request bodies for the routes outside the OpenAPI document, and their checker.

The ``/v1`` (OpenAI), ``/v1/messages`` (Anthropic) and ``/api`` (Ollama) routes are not in the
served OpenAPI document, so schemathesis does not reach them; this module is their fuzzing
corpus. The host's suite runs it against the reference backend, a backend plugin's suite
against a real backend::

    from werk_host.testing.hostile import Leaks, corpus, problems, send

    for case in corpus("tiny"):
        reply = send(base_url, key, case)
        assert not problems(case, reply, leaks), (case.name, reply)

* :func:`corpus`: a deterministic list of :class:`Case` (wrong JSON types for every top-level
  field, huge/negative/float numbers, ``NaN``/``Infinity``, deep nesting, long strings, control
  bytes, lone surrogates, invalid UTF-8, empty and non-object bodies, duplicate keys, wrong
  content types, malformed messages/content blocks/tools/tool_calls, huge ``keep_alive``/
  ``num_predict``/``num_ctx``/``max_tokens``) for every route of :data:`ROUTES`.
* :func:`strategies`: the same routes as Hypothesis strategies (Hypothesis, a test dependency,
  is imported only when this is called).
* :func:`problems`: a reply's defects: a 5xx (docs/protocol.md), an error body not in its route
  family's shape (docs/compat.md), a leak (traceback, path, pid, API key, raw backend text).
"""

from __future__ import annotations

import http.client
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

Family = Literal["openai", "anthropic", "ollama"]

#: Placeholder replaced by a raw JSON fragment when a case is serialized.
_SLOT: Final = "\u2063hostile\u2063"


@dataclass(frozen=True)
class Route:
    """One compat route: its method, path, error family, a valid body and the fields to mutate."""

    method: str
    path: str
    family: Family
    template: Mapping[str, Any] | None = None
    #: Top-level fields given wrong values (the template's own and known optional ones).
    fields: tuple[str, ...] = ()


@dataclass(frozen=True)
class Case:
    """One hostile request; ``body`` is the exact bytes sent (``None``: no body)."""

    name: str
    route: Route
    body: bytes | None
    content_type: str | None = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)
    query: str = ""
    #: The request is invalid on its face: any reply but a 4xx is a defect.
    refuse: bool = False


@dataclass(frozen=True)
class Reply:
    status: int
    content_type: str
    body: bytes


@dataclass(frozen=True)
class Leaks:
    """What no reply may contain: API keys, paths (a home, a repository, a binary), process ids."""

    secrets: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    pids: tuple[int, ...] = ()


#: The declared type of the fields Werk itself validates, per route (docs/compat.md): a value
#: of another type must be refused with a 4xx. ``?``: ``null`` allowed; ``name``: a 1–256
#: character string; ``int+``/``int0``: an integer ≥ 1 / ≥ 0; ``unit``: a number in [0, 1].
_TYPED: Final[dict[str, dict[str, str]]] = {
    path: dict(item.split(":") for item in spec.split())
    for path, spec in {
        "/v1/chat/completions": "model:name? messages:list+ max_tokens:int+? max_completion_tokens:int+? stream:bool?",
        "/v1/completions": "model:name? max_tokens:int+? stream:bool?",
        "/v1/messages": "model:name max_tokens:int+ messages:list+ stream:bool? temperature:unit? top_p:unit? "
        "top_k:int0? metadata:dict? stop_sequences:list?",
        "/v1/messages/count_tokens": "model:name messages:list+",
        "/v1/responses": "model:name max_output_tokens:int+? stream:bool? top_p:unit? metadata:dict? tools:list? "
        "instructions:str? parallel_tool_calls:bool? store:bool?",
        "/api/chat": "model:name messages:list stream:bool? options:dict?",
        "/api/generate": "model:name prompt:str? system:str? stream:bool? options:dict? raw:bool?",
        "/api/show": "model:name? name:name? verbose:bool?",
        "/api/embed": "model:name truncate:bool? dimensions:int+? options:dict?",
        "/api/embeddings": "model:name prompt:str? options:dict?",
        "/v1/embeddings": "model:name? dimensions:int+? truncate:bool? user:str?",
        "/v1/rerank": "model:name? query:str documents:list+ top_n:int+? return_documents:bool?",
    }.items()
}

_FIELDS: Final[dict[str, str]] = {  # the other fields each route takes (none: no entry)
    "/v1/chat/completions": "stream_options temperature top_p n stop seed tools tool_choice response_format "
    "presence_penalty frequency_penalty logit_bias logprobs top_logprobs reasoning_effort werk user",
    "/v1/completions": "prompt temperature top_p n stop seed echo suffix logprobs best_of logit_bias",
    "/v1/messages": "system tools tool_choice thinking service_tier output_config output_format context_management "
    "mcp_servers container",
    "/v1/messages/count_tokens": "system tools tool_choice thinking output_config context_management mcp_servers",
    "/v1/responses": "input tool_choice temperature reasoning text include previous_response_id prompt_cache_key "
    "client_metadata truncation service_tier top_logprobs",
    "/api/chat": "format keep_alive think tools",
    "/api/generate": "format keep_alive think suffix template context images",
    "/api/embed": "input keep_alive",
    "/api/embeddings": "keep_alive",
    "/v1/embeddings": "input encoding_format",
}


def _fits(kind: str, value: Any) -> bool:
    """Whether ``value`` has the declared ``kind`` (see :data:`_TYPED`)."""
    if value is None:
        return kind.endswith("?")
    base = kind.rstrip("?")
    number = isinstance(value, int | float) and not isinstance(value, bool)
    # docs/protocol.md, "Request bodies": ``5.0`` counts as an integer, as in JSON Schema.
    integral = number and (isinstance(value, int) or float(value).is_integer())
    checks = {
        "name": isinstance(value, str) and 1 <= len(value) <= 256,
        "str": isinstance(value, str),
        "int+": integral and value >= 1,
        "int0": integral and value >= 0,
        "unit": number and 0 <= value <= 1,
        "bool": isinstance(value, bool),
        "list": isinstance(value, list),
        "list+": isinstance(value, list) and len(value) > 0,
        "dict": isinstance(value, dict),
        "int": integral,
        "num0": number and value >= 0,
    }
    return checks[base]


def routes(model: str) -> tuple[Route, ...]:
    """Every compat route with a valid body for ``model`` (one output token at most)."""
    user = [{"role": "user", "content": "hi"}]
    bodies: dict[str, tuple[Family, dict[str, Any]]] = {
        "/v1/chat/completions": ("openai", {"model": model, "messages": user, "max_tokens": 1}),
        "/v1/completions": ("openai", {"model": model, "prompt": "hi", "max_tokens": 1}),
        "/v1/messages": ("anthropic", {"model": model, "max_tokens": 1, "messages": user}),
        "/v1/messages/count_tokens": ("anthropic", {"model": model, "messages": user}),
        "/v1/responses": ("openai", {"model": model, "input": "hi", "max_output_tokens": 1}),
        "/api/chat": ("ollama", {"model": model, "messages": user, "stream": False, "options": {"num_predict": 1}}),
        "/api/generate": ("ollama", {"model": model, "prompt": "hi", "stream": False, "options": {"num_predict": 1}}),
        "/api/show": ("ollama", {"model": model}),
        "/api/embed": ("ollama", {"model": model, "input": "hi"}),
        "/api/embeddings": ("ollama", {"model": model, "prompt": "hi"}),
        "/v1/embeddings": ("openai", {"model": model, "input": "hi"}),
        "/v1/rerank": ("openai", {"model": model, "query": "hi", "documents": ["hi"]}),
    }
    posts = tuple(
        Route("POST", path, family, body, tuple(_TYPED[path]) + tuple(_FIELDS.get(path, "").split()))
        for path, (family, body) in bodies.items()
    )
    gets = (("/v1/models", "openai"), ("/api/tags", "ollama"), ("/api/ps", "ollama"), ("/api/version", "ollama"))
    return posts + tuple(Route("GET", path, family) for path, family in gets)  # type: ignore[arg-type]


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


#: Wrong values for any field, as raw JSON text (some are not valid JSON on purpose).
WRONG_VALUES: Final[tuple[str, ...]] = _words(
    r'''null true 0 -1 1.5 -0.0 "" "x" [] {} [null] {"a":{}} 1e300 -1e300 1e-400 1e400 NaN Infinity -Infinity
    "\u0000\u001f" "\ud800" "\udfff\u0020x"'''
) + (str(2**63), str(-(2**63) - 1), str(2**64), "1" + "0" * 400)

#: Wrong values for fields that take a number of tokens, a context size or a duration.
HUGE_NUMBERS: Final[tuple[str, ...]] = _words(
    f'{2**31} {2**31 - 1} {2**53 + 1} {2**63 - 1} {-(2**31)} 1e20 9.999e307 0.5 "1" "-1" "1e9"'
)

_KEEP_ALIVE: Final[tuple[str, ...]] = _words(
    rf'''-1 {2**63} {-(2**63)} 1e300 1e20 -1e20 1.5 "999999999999h" "99999999999999999m" "-1s" "-99999999999999h"
    "5" "1.5s" "abc" "" "1e309s" "\u0000" "inf" "nan"'''
)


def _lines(text: str) -> tuple[Any, ...]:
    """One JSON document per non-empty line of ``text``."""
    return tuple(json.loads(line) for line in text.splitlines() if line.strip())


_MESSAGES: Final[tuple[Any, ...]] = _lines(
    r"""
[{"role": "user"}]
[{"content": "hi"}]
[{"role": "robot", "content": "hi"}]
[{"role": 1, "content": "hi"}]
[{"role": "user", "content": 1}]
[{"role": "user", "content": {"text": "hi"}}]
[{"role": "user", "content": [{}]}]
[{"role": "user", "content": [1]}]
[{"role": "user", "content": [{"type": "text"}]}]
[{"role": "user", "content": [{"type": "text", "text": 1}]}]
[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}]
[{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "%%%"}}]}]
[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": 1, "content": [{}]}]}]
[{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": 1, "input": "x"}]}]
[{"role": "assistant", "content": null, "tool_calls": "x"}]
[{"role": "assistant", "content": null, "tool_calls": [{}]}]
[{"role": "assistant", "content": null, "tool_calls": [1]}]
[{"role": "assistant", "content": null, "tool_calls": [{"function": 1}]}]
[{"role": "assistant", "content": null, "tool_calls": [{"id": 1, "type": "function", "function": {"name": 1}}]}]
[{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{x"}}]}]
[{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":{"a":[1]}}}]}]
[{"role": "user", "content": "hi"}, {"role": "tool", "content": "x"}]
[{"role": "tool", "tool_call_id": 1, "content": [{"type": "text"}]}]
[{"role": "system", "content": [{"type": "text", "text": "s"}]}, {"role": "system", "content": null}]
[{"role": "user", "content": "hi", "images": "x"}]
[{"role": "user", "content": "hi", "images": ["%%%"]}]
[{"role": "user", "content": "hi", "tool_calls": [{"function": {"name": "f", "arguments": "x"}}]}]
[{"role": "user", "content": "hi", "thinking": 1}]
[{"role": "user", "content": "hi", "name": {"a": 1}}]
[{"role": "user", "content": "hi", "name": 1}]
[{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":1,"content":"x"}]
[{"role": "user", "content": "\u0000\u0001\u001b[31m\u007f\u2028\ufeff"}]
{"role": "user", "content": "hi"}
"""
) + ([{"role": "user", "content": "hi"}] * 2000,)

_TOOLS: Final[tuple[Any, ...]] = _lines(
    r"""
[1]
["f"]
[{}]
[null]
[{"type": "function"}]
[{"type": "function", "function": 1}]
[{"type": "function", "function": {}}]
[{"type": "function", "function": {"name": 1}}]
[{"type": "function", "function": {"name": "f", "parameters": "x"}}]
[{"type": "function", "function": {"name": "f", "parameters": {"type": 7, "properties": []}}}]
[{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#"}}}]
[{"type": "function", "function": {"name": "", "description": 1}}]
[{"type": "retrieval"}]
[{"name": "f", "input_schema": 1}]
[{"name": 1, "input_schema": {"type": "object"}}]
[{"name": "f", "input_schema": {"type": "object", "properties": {"a": {"type": "nope"}}}}]
"""
) + ([{"type": "function", "function": {"name": "f"}}] * 300,)

#: Responses API ``input`` items (``/v1/responses``).
_ITEMS: Final[tuple[Any, ...]] = _lines(
    r"""
[{"type": "message", "role": "user"}]
[{"type": "message", "role": "tool", "content": "x"}]
[{"type": "message", "role": "user", "content": [{"type": "input_image"}]}]
[{"type": "message", "role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]
[{"type": "message", "role": "system", "content": [{"type": "input_image", "image_url": "data:,"}]}]
[{"type": "function_call", "call_id": 1, "name": "f", "arguments": "{}"}]
[{"type": "function_call", "call_id": "c", "name": "f f", "arguments": {}}]
[{"type": "function_call_output", "call_id": "c"}]
[{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_file"}]}]
[{"type": "reasoning", "summary": "x"}]
[{"type": "item_reference", "id": "msg_1"}]
[{"type": "web_search_call", "status": "completed"}]
[{"type": "reasoning", "summary": []}]
"""
)

_TOOL_CHOICE: Final[tuple[Any, ...]] = _lines(
    r"""
"required"
"any"
"f"
{"type": "function"}
{"type": "function", "function": {"name": 1}}
{"type": "tool", "name": 1}
{"type": "auto", "disable_parallel_tool_use": "x"}
"""
)


def _render(document: Any, fragment: str) -> bytes:
    """``document`` as JSON with the one :data:`_SLOT` string replaced by the raw ``fragment``."""
    text = json.dumps(document)
    placeholder = json.dumps(_SLOT)
    assert text.count(placeholder) == 1, "a case holds exactly one hostile slot"
    return text.replace(placeholder, fragment).encode("utf-8")


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


_OPTION_TYPES: Final[dict[str, str]] = {
    "num_predict": "int?",
    "num_ctx": "int+?",
    "temperature": "num0?",
    "top_k": "int0?",
    "top_p": "unit?",
    "seed": "int?",
    "stop": "list?",
    "num_batch": "int?",
    "num_thread": "int?",
    "num_gpu": "int?",
}
_NUMERIC: Final = frozenset(
    _words("max_tokens max_completion_tokens max_output_tokens n top_k top_logprobs logprobs best_of seed")
)
_STRINGS: Final = frozenset(["prompt", "system", "model", "suffix", "template"])
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def _strict(fragment: str) -> tuple[bool, Any]:
    """``(True, value)`` when ``fragment`` is JSON that the protocol accepts (docs/protocol.md,
    "Request bodies": finite numbers, no ``NaN``/``Infinity``, no lone surrogate), else ``(False, None)``."""

    def refuse(_: str) -> Any:
        raise ValueError("not a JSON number")

    def finite(text: str) -> float:
        value = float(text)
        if value in (float("inf"), float("-inf")):
            raise ValueError("overflow")
        return value

    try:
        value = json.loads(fragment, parse_constant=refuse, parse_float=finite)
    except ValueError:
        return False, None
    return (not (isinstance(value, str) and _SURROGATE.search(value))), value


def _refused(kind: str | None, fragment: str) -> bool:
    ok, value = _strict(fragment)
    return not ok or (kind is not None and not _fits(kind, value))


def _field_cases(route: Route) -> Iterable[Case]:
    template = dict(route.template or {})
    typed = _TYPED.get(route.path, {})
    for name in route.fields:
        values: list[str] = list(WRONG_VALUES)
        if name in _NUMERIC:
            values += HUGE_NUMBERS
        if name == "keep_alive":
            values += _KEEP_ALIVE
        if name in ("messages", "input"):
            values += [json.dumps(m) for m in _MESSAGES]
        if name == "input":
            values += [json.dumps(i) for i in _ITEMS]
        if name == "tools":
            values += [json.dumps(t) for t in _TOOLS]
        if name == "tool_choice":
            values += [json.dumps(t) for t in _TOOL_CHOICE]
        if name in _STRINGS:
            values += [json.dumps("x" * 900_000), json.dumps(["x", 1]), json.dumps([[1, 2], [3]]), _nested(60)]
        for index, value in enumerate(values):
            body = _render({**template, name: _SLOT}, value)
            refuse = _refused(typed.get(name), value)
            yield Case(f"{route.path} {name}=#{index} {value[:40]}", route, body, refuse=refuse)
    if "options" in route.fields:
        for option, kind in _OPTION_TYPES.items():
            for index, value in enumerate(WRONG_VALUES + HUGE_NUMBERS):
                body = _render({**template, "options": {"num_predict": 1, option: _SLOT}}, value)
                refuse = _refused(kind, value)
                yield Case(f"{route.path} options.{option}=#{index} {value[:40]}", route, body, refuse=refuse)


#: Media types a body route refuses (415), though some carry JSON.
_FOREIGN_TYPES: Final = ("text/plain", "text/plain;charset=UTF-8", "*/*", "application/json\x01") + (
    ("application/x-www-form-urlencoded", "multipart/form-data; boundary=x")
    + ("application/json; charset=latin-1", "application/json; charset=utf-16")
)


def _structural_cases(route: Route) -> Iterable[Case]:
    template = dict(route.template or {})
    valid = json.dumps(template).encode()
    raw: list[tuple[str, bytes | None]] = [
        ("no body", None),
        ("empty body", b""),
        ("whitespace", b" \n\t "),
        ("null", b"null"),
        ("array", b"[]"),
        ("array of the body", b"[" + valid + b"]"),
        ("number", b"1"),
        ("string", b'"x"'),
        ("true", b"true"),
        ("NaN", b"NaN"),
        ("truncated", valid[: max(1, len(valid) // 2)]),
        ("open brace", b"{"),
        ("trailing garbage", valid + b"}garbage"),
        ("two documents", valid + valid),
        ("invalid UTF-8", b'{"model": "\xff\xfe\xc3("}'),
        ("overlong UTF-8", b'{"model": "\xc0\xaf"}'),
        ("encoded surrogate", b'{"model": "\xed\xa0\x80"}'),
        ("byte-order mark", b"\xef\xbb\xbf" + valid),
        ("UTF-16", json.dumps(template).encode("utf-16")),
        ("raw control byte in a string", b'{"model": "a\x01b"}'),
        ("raw NUL", b"{\x00}"),
        ("single quotes", b"{'model': 'x'}"),
        ("comment", b"// hi\n" + valid),
        ("duplicate keys", b'{"model": "shadow", ' + valid[1:]),
        ("duplicate keys, second wins", valid[:-1] + b', "model": 1}'),
        ("deep object", b'{"a": ' * 5000 + b"1" + b"}" * 5000),
        ("deep array in a field", valid[:-1] + b', "x": ' + _nested(10_000).encode() + b"}"),
        ("just under the depth bound", valid[:-1] + b', "x": ' + _nested(62).encode() + b"}"),
        ("huge integer", valid[:-1] + b', "x": ' + b"9" * 5000 + b"}"),
        ("huge exponent", valid[:-1] + b', "x": 1e999999999}'),
        ("long key", valid[:-1] + b', "' + b"k" * 100_000 + b'": 1}'),
        ("many keys", b"{" + b", ".join(b'"k%d": %d' % (i, i) for i in range(20_000)) + b"}"),
        ("over 1 MiB", valid[:-1] + b', "x": "' + b"x" * (1 << 20) + b'"}'),
        ("lone surrogate key", valid[:-1] + b', "\\ud800": 1}'),
    ]
    accepted = {"duplicate keys", "just under the depth bound", "long key", "many keys"}
    for name, body in raw:
        refuse = route.template is not None and name not in accepted
        yield Case(f"{route.path} {name}", route, body, refuse=refuse)
    post = route.method == "POST"  # only JSON (or none) passes: docs/operations.md, "Browser safety"
    for content_type in (None, "application/json; charset=utf-8", *_FOREIGN_TYPES):
        refuse = post and content_type in _FOREIGN_TYPES
        yield Case(f"{route.path} content-type {content_type!r}", route, valid, content_type, refuse=refuse)
    yield Case(f"{route.path} form", route, b"model=x&messages=y", "application/x-www-form-urlencoded", refuse=post)
    for query in ("?stream=true", "?model=%00", "?%ff=%fe", "?" + "a=1&" * 2000, "?beta=true&model=" + "x" * 4000):
        yield Case(f"{route.path} query {query[:30]!r}", route, valid if route.template else None, query=query)


def _header_cases(route: Route) -> Iterable[Case]:
    body = json.dumps(dict(route.template or {})).encode() if route.template else None
    hostile = {
        "anthropic-version": ("\x01", "2023-06-01\x7f", "9999-99-99", "x" * 8000),
        "anthropic-beta": ("\x01", "x" * 8000),
        "X-Werk-Deployment": ("\x01", "../../etc", "x" * 8000),
        "Accept": ("text/event-stream\x01", "application/x-nope"),
    }
    for header, values in hostile.items():
        for index, value in enumerate(values):
            yield Case(f"{route.path} header {header} #{index}", route, body, headers={header: value})


def corpus(model: str, *, only: Sequence[str] | None = None) -> list[Case]:
    """The deterministic corpus for ``model``: every route of :func:`routes` (or only the paths
    in ``only``), in a fixed order."""
    cases: list[Case] = []
    for route in routes(model):
        if only is not None and route.path not in only:
            continue
        if route.template is not None:
            cases.extend(_field_cases(route))
        cases.extend(_structural_cases(route))
        cases.extend(_header_cases(route))
    return cases


def send(base: str, key: str | None, case: Case, *, timeout: float = 120.0) -> Reply:
    """Send ``case`` to ``base`` (``http://host:port``) over a fresh connection; read the reply whole."""
    host, _, port = base.removeprefix("http://").partition(":")
    conn = http.client.HTTPConnection(host, int(port or 80), timeout=timeout)
    headers: dict[str, str] = {"Accept": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    if case.content_type is not None:
        headers["Content-Type"] = case.content_type
    headers.update(case.headers)
    try:
        conn.putrequest(case.route.method, case.route.path + case.query, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value.encode("latin-1"))
        if case.body is not None:
            conn.putheader("Content-Length", str(len(case.body)))
        conn.endheaders(case.body)
        resp = conn.getresponse()
        return Reply(resp.status, resp.getheader("Content-Type") or "", resp.read())
    finally:
        conn.close()


#: Text that only a traceback, an exception or a backend's own error message contains.
_BACKEND_TEXT: Final = re.compile(
    r"Traceback \(most recent call last\)|File \"|site-packages|\.py\"|\.py:\d|Exception:|Error\(|"
    r"json\.exception|\[json\.|type must be|parse error at|Failed to parse|n_ctx|n_predict|n_probs|"
    r"llama_|common_|std::|what\(\)|id_slot|exceeds the available context size|Unsupported param|"
    r"[Jj]inja|Value is not callable|Unknown method|Expected '|<!DOCTYPE|<html"
)


def _error_shape(family: Family, document: Any) -> str | None:
    """Why ``document`` is not ``family``'s error body, or ``None``."""
    if not isinstance(document, dict):
        return "the error body is not a JSON object"
    error = document.get("error")
    if family == "ollama":
        return None if isinstance(error, str) and error else "not Ollama's {'error': str}"
    if family == "anthropic" and document.get("type") != "error":
        return "not Anthropic's {'type': 'error', ...}"
    if not isinstance(error, dict):
        return "no 'error' object"
    if not (isinstance(error.get("message"), str) and error["message"]):
        return "no error.message string"
    if not (isinstance(error.get("type"), str) and error["type"]):
        return "no error.type string"
    return None


def _readable(text: str) -> str:
    """``text`` plus, when it is JSON, every string in it decoded (a leak may hide behind escapes)."""
    try:
        stack: list[Any] = [json.loads(text)]
    except ValueError:
        return text
    strings = [text]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            strings.extend(str(key) for key in value)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, str):
            strings.append(value)
    return "\n".join(strings)


def problems(case: Case, reply: Reply, leaks: Leaks, *, allowed_5xx: Iterable[int] = ()) -> list[str]:
    """Everything wrong with ``reply`` to ``case`` (an empty list: nothing)."""
    found: list[str] = []
    if reply.status >= 500 and reply.status not in set(allowed_5xx):
        found.append(f"server error {reply.status}")
    elif case.refuse and reply.status < 400:
        found.append(f"an invalid request was accepted ({reply.status})")
    text = _readable(reply.body.decode("utf-8", "replace"))
    for secret in leaks.secrets:
        if secret and secret in text:
            found.append("an API key in the body")
    for path in leaks.paths:
        if path and path in text:
            found.append(f"a path in the body: {path}")
    if reply.status < 400:
        return found
    for pid in leaks.pids:
        if re.search(rf"(?<![\w.]){pid}(?![\w.])", text):
            found.append(f"process id {pid} in the body")
    if _BACKEND_TEXT.search(text):
        found.append(f"traceback or backend text in the body: {_BACKEND_TEXT.search(text)!r}")
    if not reply.content_type.startswith("application/json"):
        found.append(f"error content type {reply.content_type!r}")
        return found
    try:
        document = json.loads(reply.body)
    except ValueError:
        found.append("the error body is not JSON")
        return found
    shape = _error_shape(case.route.family, document)
    if shape is not None:
        found.append(shape)
    return found


def strategies(model: str) -> Any:
    """A Hypothesis strategy of :class:`Case`: a route's template with random fields replaced by
    random JSON (strings with control characters and lone surrogates included), or random bytes."""
    from hypothesis import strategies as st

    text = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | text
    values = st.recursive(
        scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4), max_leaves=12
    )
    posts = [r for r in routes(model) if r.template is not None]

    @st.composite
    def mutated(draw: Any) -> Case:
        route = draw(st.sampled_from(posts))
        body = dict(route.template or {})
        names = draw(st.lists(st.sampled_from(route.fields) | text, min_size=1, max_size=4, unique=True))
        for name in names:
            body[name] = draw(values)
        if draw(st.booleans()) and "options" in route.fields:
            body["options"] = draw(st.dictionaries(st.sampled_from(sorted(_OPTION_TYPES)), values, max_size=3))
        try:
            raw = json.dumps(body, ensure_ascii=draw(st.booleans())).encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: sent as its escape
            raw = json.dumps(body).encode("utf-8")
        return Case(f"{route.path} generated", route, raw)

    @st.composite
    def garbage(draw: Any) -> Case:
        route = draw(st.sampled_from(posts))
        return Case(f"{route.path} generated bytes", route, draw(st.binary(max_size=200)))

    return mutated() | garbage()


__all__ = ["Case", "Family", "Leaks", "Reply", "Route", "corpus", "problems", "routes", "send", "strategies"]
