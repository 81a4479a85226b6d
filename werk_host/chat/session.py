"""One conversation over a transport: what ``werk chat`` and ``werk run`` share (docs/chat.md).

:class:`ChatSession` holds the messages, sends each turn as a streamed chat completion and,
with a session directory (``--persistence``/``--session``), keeps the archive and the native
snapshot (:mod:`werk_host.chat.native`) in step with what completed:

* a turn joins the conversation (and the archive) only when its response completed; an
  interrupted (Ctrl-C) or failed turn leaves both as they were and publishes no snapshot;
* the native snapshot is verified and restored right before the first real request, never at
  open; a failed restore is reported as a warning and the request simply carries the whole
  conversation, as it always does.

Diagnostics go to two callbacks: ``note`` (shown with ``--verbose``) and ``warn`` (always shown).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path

from werk_host.chat.archive import Conversation, Message, SessionDir
from werk_host.chat.native import NativeCache, NativeReport, NativeStatus
from werk_host.chat.stream import TurnResult, read_turn
from werk_host.chat.transport import Transport
from werk_host.errors import ErrorCode, WerkError
from werk_host.seam import JsonObject

Say = Callable[[str], None]


@dataclass(frozen=True)
class Sampling:
    """Per-request sampling settings (``None``: the backend's default)."""

    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None

    def body(self) -> JsonObject:
        out: JsonObject = {}
        if self.max_tokens is not None:
            out["max_tokens"] = self.max_tokens
        if self.temperature is not None:
            out["temperature"] = self.temperature
        if self.seed is not None:
            out["seed"] = self.seed
        return out


class ChatSession:
    """A conversation with one model (see the module docstring). Call :meth:`close` when done."""

    def __init__(
        self,
        transport: Transport,
        sampling: Sampling,
        *,
        home: Path,
        store: SessionDir | None = None,
        system: str | None = None,
        note: Say,
        warn: Say,
    ) -> None:
        self.transport = transport
        self.sampling = sampling
        self.home = home
        self.note = note
        self.warn = warn
        self.store: SessionDir | None = None
        self.native: NativeCache | None = None
        self.native_report = NativeReport(NativeStatus.UNAVAILABLE, "no session: nothing is saved")
        self.resumed = 0
        self._slot_current = False
        self.conversation = Conversation(transport.model, transport.model_sha256)
        if store is not None:
            saved = store.load()
            if saved is not None:
                if not saved.same_model(transport.model, transport.model_sha256):
                    raise WerkError(
                        ErrorCode.INVALID_REQUEST,
                        f"session {store.name} holds a conversation with model {saved.model}, not {transport.model}",
                    )
                self.conversation = Conversation(transport.model, transport.model_sha256, saved.messages)
                self.resumed = len(saved.messages)
            self._attach(store)
        if system is not None:
            self._set_system(system)

    # -- persistence -----------------------------------------------------------------------
    def _attach(self, store: SessionDir) -> None:
        self.store = store
        slot, reason = self.transport.native()
        if slot is None:
            self.native, self.native_report = None, NativeReport(NativeStatus.UNAVAILABLE, reason)
            return
        cache = NativeCache(store.native_dir, slot)
        self.native_report = cache.open()
        self.native = cache if self.native_report.status is not NativeStatus.UNAVAILABLE else None

    def _persist(self) -> None:
        if self.store is None:
            return
        try:
            self.store.save(self.conversation)
        except (WerkError, OSError) as err:
            detail = err.message if isinstance(err, WerkError) else type(err).__name__
            self.warn(f"the conversation archive was not updated ({detail})")

    def _set_system(self, text: str) -> None:
        messages = [m for m in self.conversation.messages if m.role != "system"]
        self.conversation.messages = [Message("system", text), *messages]
        self._persist()

    def save_as(self, name: str) -> NativeReport:
        """Keep the conversation (from now on) in session ``name``; returns its native report.

        Refuses a name that already holds another conversation."""
        if self.store is not None and self.store.name == name:
            self._persist()
            return self.native_report
        store = SessionDir(self.home, name)
        try:
            if store.exists():
                raise WerkError(ErrorCode.CONFLICT, f"session {name} already exists")
            store.save(self.conversation)
        except BaseException:
            store.close()
            raise
        carry = self.native is not None and self._slot_current
        if self.store is not None:
            self.store.close()
        self._attach(store)
        if carry and self.native is not None:  # the session slot holds this very conversation
            outcome = self.native.commit(None, complete=True)
            if outcome.save_error is not None:
                self.warn(f"no native snapshot was saved ({outcome.save_error})")
        return self.native_report

    def reset(self) -> None:
        """Forget the messages (the system message stays) and the native snapshot."""
        self.conversation.messages = [m for m in self.conversation.messages if m.role == "system"]
        self._persist()
        if self.native is not None:
            self.native.invalidate(receipt=False)
        self._slot_current = False

    # -- a turn ------------------------------------------------------------------------------
    def ask(self, text: str, on_text: Say) -> TurnResult:
        """Send ``text`` as the next user message and stream the answer to ``on_text``.

        Returns the turn's result; ``interrupted`` when Ctrl-C stopped it (the generation is
        cancelled, nothing is kept). Raises ``WerkError`` when the request was refused."""
        user = Message("user", text)
        body: JsonObject = {
            "model": self.transport.model,
            "messages": [m.to_json() for m in (*self.conversation.messages, user)],
            "stream": True,
            "stream_options": {"include_usage": True},
            **self.sampling.body(),
        }
        result = TurnResult()
        if self.native is not None:
            try:
                restored = self.native.restore_if_pending()
            except KeyboardInterrupt:
                result.interrupted = True
                self._finish(user, result)
                return result
            if restored is not None and restored.error is not None:
                self.warn(
                    f"the native snapshot could not be restored ({restored.error}); "
                    "rebuilding the context from the conversation archive"
                )
            elif restored is not None:
                self.note(
                    f"restore: {restored.tokens} tokens from the native snapshot in {restored.seconds:.3f} s "
                    "(session key, size and SHA-256 verified)"
                )
        started = time.monotonic()
        try:
            response = self.transport.open(body, session=self.native is not None)
        except KeyboardInterrupt:  # during admission or before the first byte: nothing ran to the end
            result.interrupted = True
            self._finish(user, result)
            return result
        try:
            read_turn(response.body, on_text, started=started, into=result)
        except KeyboardInterrupt:
            result.interrupted = True
        except (WerkError, OSError, HTTPException) as err:  # the stream broke: an incomplete turn
            result.error = err.message if isinstance(err, WerkError) else f"the stream broke ({type(err).__name__})"
        finally:
            response.close()
        self._finish(user, result)
        return result

    def _finish(self, user: Message, result: TurnResult) -> None:
        if result.first_token_s is not None:
            self.note(f"first token: {result.first_token_s:.3f} s")
        if not result.complete:
            self._slot_current = False
            if self.native is not None:
                self.native.commit(None, complete=False)
            return
        self.conversation.messages += [user, Message("assistant", result.text)]
        self._persist()
        usage = result.usage
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens", "?") if isinstance(details, dict) else "?"
        prompt, completion = usage.get("prompt_tokens", "?"), usage.get("completion_tokens", "?")
        self.note(f"usage: prompt {prompt} tokens, cached {cached}, completion {completion}")
        if self.native is None:
            return
        outcome = self.native.commit(result.usage_event, complete=True)
        self._slot_current = outcome.save_error is None
        if outcome.evidence is not None:
            self.note(outcome.evidence)
        if outcome.save_error is not None:
            self.warn(f"no native snapshot was saved ({outcome.save_error})")
        else:
            self.note(f"snapshot: {outcome.saved_bytes} bytes saved in {outcome.save_seconds:.3f} s")

    def close(self) -> None:
        """Release the session lock and stop what the transport started."""
        try:
            if self.store is not None:
                self.store.close()
        finally:
            self.transport.close()


__all__ = ["ChatSession", "Sampling"]
