"""Tool calls on llama.cpp (docs/compat.md, "OpenAI"; NATIVE_NOTES.md, "Tool calls").

What the running llama-server does with tools, observed (NATIVE_NOTES.md): its chat template
may or may not render ``tools`` and assistant ``tool_calls`` (SmolLM2's renders neither; an
assistant call comes out as an empty turn), and ``tool_choice`` (``"required"``, a named
function) is never enforced, not even where the template renders the tools; a
``response_format`` JSON schema does constrain the output. So:

* **Evidence, once per process** (:func:`template_tools`): ``/apply-template`` of one probe
  conversation with a probe tool and an assistant call of a second probe name. The template
  *renders tools* when the tool's name is in the prompt, *renders calls* when the call's name
  is. A rendering llama-server refuses (a template that raises) renders neither; a server that
  does not answer is a retryable ``unavailable`` and is asked again next time, so a count and
  the chat never decide differently.
* **History** (every request with tool turns, whatever its ``tool_choice``): on a template that
  does not render calls, assistant ``tool_calls`` and ``tool`` results become plain text turns
  (:func:`werk_host.plugin.tools.render_history`), so a follow-up turn shows the model its call
  and the result.
* **A forced choice** (``"required"`` or a named function; :func:`werk_host.plugin.tools.forced_call`)
  is always made real by Werk, since llama-server never forces one: the call's JSON schema as
  ``response_format``, ``tool_choice`` removed, and where the template does not render tools
  the tools described in the system message; the answer is parsed back into ``tool_calls``
  (:meth:`werk_host.plugin.tools.ForcedCall.relay`).
* ``"auto"`` and ``"none"`` pass through unchanged (besides the history): on a template that
  renders no tools the model does not see them and answers text.
* **Counting** renders exactly the body the chat sends (:func:`counted`), so
  ``/werk/v1/chat/count_tokens`` equals the answer's ``usage.prompt_tokens`` with tools present.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

from werk_host.plugin import ChatRequest, JsonObject
from werk_host.plugin.tools import ForcedCall, forced_call, has_tool_turns, render_history

from .core import unavailable
from .native import NativeError, NativeHTTPError
from .process import LlamaServerProcess

if TYPE_CHECKING:
    from .adapter import LlamaCppAdapter

__all__ = ["TemplateTools", "chat_body", "counted", "template_tools"]

_PROBE_TOOL = "werk_probe_tool_q7k"
_PROBE_CALL = "werk_probe_call_z3m"
_PROBE_MESSAGES = (
    {"role": "user", "content": "hello"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_probe", "type": "function", "function": {"name": _PROBE_CALL, "arguments": "{}"}}],
    },
    {"role": "tool", "tool_call_id": "call_probe", "content": "done"},
)
_PROBE_TOOLS = [
    {"type": "function", "function": {"name": _PROBE_TOOL, "description": "a probe", "parameters": {"type": "object"}}}
]
#: Seconds one rendering may take (the server answers from memory).
_RENDER_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class TemplateTools:
    """What one llama-server's chat template renders (module docstring)."""

    renders_tools: bool
    renders_calls: bool


_lock = threading.Lock()
_seen: weakref.WeakKeyDictionary[LlamaServerProcess, TemplateTools] = weakref.WeakKeyDictionary()


def template_tools(proc: LlamaServerProcess) -> TemplateTools:
    """``proc``'s template evidence, gathered once per process (module docstring)."""
    with _lock:
        known = _seen.get(proc)
    if known is not None:
        return known
    client = proc.new_client(timeout=_RENDER_TIMEOUT_S)
    try:
        prompt = client.apply_template(_PROBE_MESSAGES, tools=_PROBE_TOOLS)
        evidence = TemplateTools(_PROBE_TOOL in prompt, _PROBE_CALL in prompt)
    except NativeHTTPError as err:
        if err.status == 503:
            raise unavailable("llama-server is busy or loading; retry shortly") from err
        evidence = TemplateTools(False, False)  # the template refuses tool turns: render them ourselves
    except NativeError as err:
        raise unavailable("llama-server did not answer a template rendering") from err
    finally:
        client.close()
    with _lock:
        _seen[proc] = evidence
    return evidence


def chat_body(adapter: LlamaCppAdapter, body: JsonObject) -> tuple[JsonObject, ForcedCall | None]:
    """The ``/v1/chat/completions`` body llama-server gets for ``body`` (``werk`` already
    removed), and the forced call to parse its answer back into, if any (module docstring).
    A body without tools and tool turns is returned as it is, without asking the server."""
    forced = forced_call(body)
    history = has_tool_turns(body.get("messages"))
    if forced is None and not history:
        return body, None
    evidence = template_tools(adapter.process())
    messages = body.get("messages")
    if history and not evidence.renders_calls and isinstance(messages, list):
        body = {**body, "messages": render_history(messages)}
    if forced is not None:
        body = forced.constrained_body(body, render_tools=not evidence.renders_tools)
    return body, forced


def counted(adapter: LlamaCppAdapter, request: ChatRequest) -> ChatRequest:
    """``request`` as :func:`chat_body` sends it, for counting. A request :func:`chat_body` leaves
    as it is (no forced choice, no tool turns: most counts) is returned without a copy."""
    plain = not any(  # no tool turn, as :func:`has_tool_turns` tells it of the body
        m.role in ("tool", "function") or m.tool_calls or (m.model_extra or {}).get("function_call")
        for m in request.messages
    )
    if plain and request.tool_choice in (None, "auto", "none"):
        return request
    body = request.model_dump(mode="json", exclude_none=True)
    sent, _ = chat_body(adapter, body)
    return request if sent is body else ChatRequest.model_validate(sent)
