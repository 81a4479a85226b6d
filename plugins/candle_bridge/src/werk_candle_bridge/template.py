"""Prompts: Werk renders the model's chat template; the engine tokenizes exactly that text.

Every request reaches the engine as one *raw prompt* (docs/candle.md, "Prompts and exact
counts"). The engine is loaded with an explicit template (:func:`engine_template`) whose first
branch passes a single message of role :data:`RAW_ROLE` through verbatim; Werk renders chat
messages itself with the GGUF's own chat template (:class:`PromptRenderer`). So a chat prompt's
``prompt_tokens`` is the engine tokenizer's count of a string Werk holds, and
``count_tokens`` is exact by construction. The original template stays in the explicit
template's other branch, where the engine reads it as before (its end-of-turn tokens, e.g.
``<|im_end|>``, are found there).

The renderer is set up like the engine's own (mistral.rs ``apply_chat_template_to``, MiniJinja
with ``trim_blocks``, ``lstrip_blocks`` and Python-method compatibility, ``raise_exception``,
``strftime_now`` and ``tojson``; the same source rewrites; the context ``messages``,
``add_generation_prompt``, ``bos_token``, ``eos_token``, ``unk_token``, ``date_string`` and
``enable_thinking``), so the text is what the engine itself would have rendered; the tests
compare both on real models.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import minijinja

from werk_host.plugin import ErrorCode, WerkError

__all__ = ["RAW_ROLE", "Message", "PromptRenderer", "engine_template"]

#: The role of the single message that carries a raw prompt to the engine.
RAW_ROLE = "werk_raw_prompt"
#: Roles a chat message may have here (the host validates OpenAI's roles; tools are refused).
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant"})

_NO_TEMPLATE = "this model has no chat template: use /v1/completions with a prompt"
_RANGE_DOWN = re.compile(r"range\((?P<expr>[^,]+),\s*-1,\s*-1\)")


@dataclass(frozen=True)
class Message:
    """A chat message as the template sees it: a role and plain text."""

    role: str
    content: str


def _rewrite(source: str) -> str:
    """The engine's rewrites of Python-only template syntax (mistral.rs ``apply_chat_template_to``)."""
    source = source.replace("[::-1]", "|reverse")
    source = _RANGE_DOWN.sub(lambda m: f"range({m.group('expr')})|reverse", source)
    if "{{ meta }}" in source:
        source = source.replace('{%- set meta = message.get("metadata", "") %}', "").replace("{{ meta }}", "")
    if "{% generation %}" in source and "{% endgeneration %}" in source:
        source = source.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    return source


def engine_template(chat_template: str | None) -> str:
    """The explicit template the engine is loaded with (module docstring).

    The ``{{ '' }}`` guards keep ``trim_blocks``/``lstrip_blocks`` from eating whitespace at the
    original template's edges, so its branch renders exactly as the template alone would."""
    original = chat_template if chat_template is not None else "{{ raise_exception('" + _NO_TEMPLATE + "') }}"
    # A template source loses one trailing newline (keep_trailing_newline is off); inside the
    # wrapper it is no longer trailing, so drop it here.
    original = original.removesuffix("\r\n") if original.endswith("\r\n") else original.removesuffix("\n")
    return (
        "{% if messages|length == 1 and messages[0]['role'] == '" + RAW_ROLE + "' %}"
        "{{ messages[0]['content'] }}{% else %}{{ '' }}" + original + "{{ '' }}{% endif %}"
    )


def _raise_exception(message: str) -> str:
    raise minijinja.TemplateError(str(message))


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now(datetime.UTC).strftime(str(fmt))


def _tojson(value: object, indent: int | None = None) -> minijinja.Markup:
    """JSON as the engine's ``tojson`` prints it: Python's ``json.dumps`` spacing, non-ASCII
    and HTML characters kept as they are."""
    return minijinja.Markup(json.dumps(value, ensure_ascii=False, indent=indent))


def _finalize(value: object) -> object:
    """Print booleans and ``none`` as MiniJinja in Rust does (``true``, ``none``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "none" if value is None else value


class PromptRenderer:
    """Renders chat messages with one model's template (see the module docstring). Thread-safe."""

    def __init__(
        self,
        chat_template: str | None,
        *,
        bos_token: str | None,
        eos_token: str | None,
        unk_token: str | None,
    ) -> None:
        self.has_template = chat_template is not None
        self._source = _rewrite(chat_template) if chat_template is not None else None
        self._tokens: Mapping[str, str | None] = {
            "bos_token": bos_token,
            "eos_token": eos_token,
            "unk_token": unk_token,
        }
        self._env = minijinja.Environment(
            filters={"tojson": _tojson},
            globals={"raise_exception": _raise_exception, "strftime_now": _strftime_now},
            debug=False,
            trim_blocks=True,
            lstrip_blocks=True,
            finalizer=_finalize,
            pycompat=True,
        )

    def render(self, messages: Sequence[Message]) -> str:
        """The prompt text for ``messages`` with the generation prompt appended.

        Raises ``invalid_request`` when the model has no chat template or the template refuses
        the conversation (``raise_exception``, a role or order it does not accept)."""
        if self._source is None:
            raise WerkError(ErrorCode.INVALID_REQUEST, _NO_TEMPLATE)
        context: dict[str, object] = {
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "add_generation_prompt": True,
            **self._tokens,
            "date_string": datetime.datetime.now(datetime.UTC).strftime("%d, %B, %Y"),
            "enable_thinking": True,
        }
        try:
            return str(self._env.render_str(self._source, **context))
        except minijinja.TemplateError as err:
            reason = str(err).split(" (in ", 1)[0].strip()[:200] or "the template failed"
            raise WerkError(
                ErrorCode.INVALID_REQUEST, f"the model's chat template refused these messages: {reason}"
            ) from err
