"""Automatic prompt caches on a managed ``llama-server`` (the ``werk_prompt_cache`` hook;
docs/prompt-cache.md).

:class:`LlamaPromptCache` is this plugin's :class:`werk_host.plugin.PromptCache`: the host owns
the store, the per-key fingerprints, the budget and the reuse rules; this module only touches
the process:

* **Leases.** Every ordinary request the host serves through it holds one ordinary slot
  (:mod:`.slots`), chosen for its owner: the free slot booked with the longest prefix of the
  request's tokens for that owner, else a fresh one, else the least recently used. A slot that
  held another owner's tokens is erased before it serves (``POST /slots/<n>?action=erase``);
  llama-server's own shared host-memory cache is off (``--cache-ram 0``, :mod:`.core`). So two
  keys sending the same document share nothing.
* **Prompt tokens**: the chat body as :meth:`LlamaCppAdapter.chat_completion` sends it,
  rendered by llama-server (``/apply-template``) and tokenized (``/tokenize``, specials parsed
  and added), exactly as the chat evaluates it.
* **Save**: ``POST /slots/<n>?action=save`` into the process's private slot directory; the
  file must be a regular file of exactly the acknowledged size, and its token ids (read from
  the file) are what the host fingerprints. The payload is the raw slot file, opened before
  it is handed over (a stop that clears the directory cannot cut it short).
* **Restore**: the stored compatibility key must equal :meth:`LlamaPromptCache.cache_key`; the
  payload the host verified (size, SHA-256) is presented to llama-server as that very inode
  (:func:`.snapshot.presented`); the acknowledgement must be exact (``n_restored`` and
  ``n_read`` equal to the saved counts), else the slot is erased and ``corrupt_state`` raised.
* **Evidence against reuse.** A model whose cache is partly outside a slot file
  (sliding-window or recurrent layers, :func:`.gguf_meta.partial_cache`) is not restored unless
  the child keeps the full cache (``--swa-full``); a restore the backend's counters then show
  was not reused (reported by the host through :meth:`LlamaPromptCache.invalidate`) turns the
  mechanism off for this child with that reason.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import stat
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

from werk_host.plugin import (
    ErrorCode,
    InferenceResponse,
    JsonObject,
    SavedPrompt,
    Snapshot,
    StoredStateRef,
    WerkError,
)
from werk_host.plugin.http import BackendSlow, post_json
from werk_host.plugin.tools import ForcedCall

from . import reasoning, tools
from .integrity import slot_file_tokens
from .native import NativeConnectionError, NativeError
from .process import LlamaServerProcess
from .session import cache_count
from .slots import SlotLease, SlotRecord, child_died, common_prefix, prepare, send
from .snapshot import acknowledged, presented_entry

if TYPE_CHECKING:
    from .adapter import LlamaCppAdapter

log = logging.getLogger(__name__)

__all__ = ["PROMPT_CACHE_LAYOUT", "LlamaPromptCache", "LlamaPromptLease"]

#: The layout of a prompt-cache payload: the raw llama-server slot file.
PROMPT_CACHE_LAYOUT: Final = "werk-llamacpp-prompt-v1"
_CHUNK: Final = 1 << 20
_CHAT: Final = "/v1/chat/completions"
#: Fields of a chat body that do not reach the template.
_UNRENDERED: Final = ("stream", "stream_options", "werk")


def _unavailable(message: str) -> WerkError:
    return WerkError(ErrorCode.UNAVAILABLE, message, retryable=True)


class LlamaPromptCache:
    """The ordinary slots of one live llama-server generation as prompt caches."""

    def __init__(self, adapter: LlamaCppAdapter, proc: LlamaServerProcess) -> None:
        self.adapter = adapter
        self.proc = proc

    def _live(self) -> LlamaServerProcess:
        if self.adapter.current() is not self.proc:
            raise _unavailable("llama-server restarted; retry")
        return self.proc

    def cache_key(self) -> dict[str, str]:
        key = dict(self.adapter.compat_key_of(self._live()))
        key["cache_layout"] = PROMPT_CACHE_LAYOUT
        return key

    def unavailable_reason(self) -> str | None:
        proc = self.proc
        if proc.slot_dir is None or proc.effective_slot_save_path() != proc.slot_dir:
            return "the effective arguments disable or move llama-server's slot saving"
        known = self.adapter.prompt_cache_off.get(proc.generation) or proc.persistence_off(wait=False)
        if known is not None:
            return known
        kind = self.adapter.partial_cache_kind()
        if kind is not None and "--swa-full" not in proc.argv:
            return (
                f"this model keeps a {kind} cache, which llama-server does not reuse after a restore "
                "unless it keeps the full cache: launch it with --swa-full (WERK_LLAMA_ARGS=--swa-full, "
                "or the instance's args), at the memory cost of a full-size cache"
            )
        return None

    def invalidate(self, reason: str) -> None:
        self.adapter.prompt_cache_off[self.proc.generation] = (
            f"a restored prefix was not reused by llama-server ({reason}); prompt caches are off for this process"
        )

    def _body(self, path: str, request: JsonObject) -> tuple[JsonObject, ForcedCall | None]:
        if path == _CHAT:
            return tools.chat_body(self.adapter, reasoning.forwarded_chat(request))
        return {k: v for k, v in request.items() if k != "werk"}, None

    def prompt_tokens(self, path: str, request: JsonObject) -> list[int] | None:
        proc = self._live()
        pool = self.adapter.proxy_pool(proc)
        body, _ = self._body(path, request)
        try:
            if path == _CHAT:
                rendered = {k: v for k, v in body.items() if k not in _UNRENDERED}
                text = post_json(pool, "/apply-template", rendered)["prompt"]
            else:
                prompt = body.get("prompt")
                if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
                    return [int(t) for t in prompt if isinstance(t, int)]
                if not isinstance(prompt, str):
                    return None
                text = prompt
            answer = post_json(pool, "/tokenize", {"content": text, "add_special": True, "parse_special": True})
            tokens = answer["tokens"]
        except BackendSlow:  # alive but unresponsive: no second bound on it in this request
            raise
        except WerkError as err:
            if err.code is ErrorCode.INVALID_REQUEST:
                raise
            return None
        except (KeyError, TypeError):
            return None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            return None
        return tokens

    def lease(self, owner: str, tokens: list[int] | None) -> LlamaPromptLease:
        """An ordinary slot for ``owner``, erased when foreign. A child found dead by the erase
        is restarted once and the slot taken there (its slots are empty), as
        :func:`.slots.forward_ordinary` does; this cache then speaks for the new child."""
        adapter = self.adapter
        for attempt in (1, 2):
            if adapter.current() is not self.proc and not self.proc.alive():  # it died since the hook
                self.proc = adapter.process()
            proc = self._live()
            held = adapter.router.acquire(
                proc.effective_parallel(),
                owner=owner,
                tokens=tokens,
                generation=proc.generation,
                epoch=adapter.state_epoch,
            )
            try:
                prepare(adapter, proc, held)
            except WerkError as err:
                held.release()
                if attempt == 2 or not child_died(proc, err):
                    raise
                log.warning("llama-server (generation %s) died before a slot erase; restarting it", proc.generation[:8])
                self.proc = adapter.process()
                continue
            except BaseException:
                held.release()
                raise
            return LlamaPromptLease(self, proc, held, tokens)
        raise AssertionError("unreachable")  # pragma: no cover


#: How a prompt-cache entry is named in errors.
ENTRY: Final = "prompt cache entry"


class LlamaPromptLease:
    """One ordinary slot held for one request (see the module docstring)."""

    def __init__(self, cache: LlamaPromptCache, proc: LlamaServerProcess, lease: SlotLease, tokens: list[int] | None):
        self.cache = cache
        self.adapter = cache.adapter
        self.proc = proc
        self.slot = lease
        self.tokens = tokens
        self.held = lease.held(tokens)
        self.restarted = False
        lease.tokens = tuple(tokens[: self.held]) if tokens is not None else ()

    def restore(self, stored: StoredStateRef) -> int:
        n_saved, n_written = acknowledged(stored, self.cache.cache_key(), ENTRY)
        client, slot = self.adapter.client(self.proc), self.slot.slot
        assert self.proc.slot_dir is not None
        self.slot.tokens = ()  # whatever happens below, the slot's old contents are gone
        try:
            with presented_entry(stored, self.proc.slot_dir, n_written, ENTRY) as (fd, name):
                held = slot_file_tokens(fd, n_written)
                restored = client.slot_restore(slot, name)
            if restored.n_restored != n_saved or restored.n_read != n_written or len(held) != n_saved:
                raise WerkError(ErrorCode.CORRUPT_STATE, "restore acknowledgement does not match the entry")
        except BaseException as err:
            with contextlib.suppress(NativeError):
                client.slot_erase(slot)
            if isinstance(err, NativeConnectionError):
                raise self.adapter.native_failure(err, "prompt cache restore") from err
            if isinstance(err, NativeError):
                raise WerkError(ErrorCode.CORRUPT_STATE, "llama-server rejected the prompt cache entry") from err
            raise
        self.slot.found = SlotRecord(self.slot.owner, tuple(held), self.adapter.state_epoch)
        if self.tokens is None:  # no request yet (a warm start): the slot holds all of it
            self.slot.tokens = tuple(held)
            return 0
        common = common_prefix(held, self.tokens)
        self.slot.tokens = tuple(held[:common])
        return common

    def forward(self, path: str, request: JsonObject) -> InferenceResponse:
        """Relay on the leased slot; a child that died before answering is restarted and the
        request sent there once more, as :func:`.slots.forward_ordinary` does (whatever was
        restored died with it: the cache count is then unknown, never a miss)."""
        body, forced = self.cache._body(path, request)
        for attempt in (1, 2):
            self.slot.epoch = self.adapter.state_epoch
            try:
                response = send(self.adapter, self.proc, self.slot, path, body)
                break
            except WerkError as err:
                if attempt == 2 or not child_died(self.proc, err):
                    raise
                log.warning(
                    "llama-server (generation %s) died before answering; restarting it", self.proc.generation[:8]
                )
                self.proc, self.restarted = self.adapter.process(), True
                self.slot.found = SlotRecord(epoch=self.adapter.state_epoch)  # a new child's slots are empty
        if self.tokens is not None:
            self.slot.tokens = tuple(self.tokens)
        return response if forced is None else forced.relay(response, stream=body.get("stream") is True)

    def cached_tokens(self, usage_event: JsonObject) -> int | None:
        return None if self.restarted else cache_count(usage_event)

    def save(self) -> SavedPrompt | None:
        proc = self.proc
        assert proc.slot_dir is not None
        name = f"werk-prompt-{secrets.token_hex(16)}.bin"
        path = proc.slot_dir / name
        try:
            saved = self.adapter.client(proc).slot_save(self.slot.slot, name)
        except NativeError as err:
            path.unlink(missing_ok=True)
            raise self.adapter.native_failure(err, "prompt cache save") from err
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as err:
            raise _unavailable("llama-server's saved slot file is gone") from err
        finally:
            path.unlink(missing_ok=True)  # the open descriptor keeps the bytes
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size != saved.n_written or saved.n_saved <= 0:
                raise WerkError(ErrorCode.INTERNAL, "llama-server's save acknowledgement does not match the slot file")
            tokens = slot_file_tokens(fd, saved.n_written)
            if len(tokens) != saved.n_saved:
                raise WerkError(ErrorCode.INTERNAL, "llama-server's slot file holds another token count than it saved")
        except BaseException:
            os.close(fd)
            raise
        self.slot.tokens = tuple(tokens)
        source = os.fdopen(fd, "rb")

        def chunks() -> Iterator[bytes]:
            while chunk := source.read(_CHUNK):
                yield chunk

        snapshot = Snapshot(
            chunks=chunks(),
            size=saved.n_written,
            close=source.close,
            adapter_meta={"n_saved": saved.n_saved, "n_written": saved.n_written},
        )
        return SavedPrompt(snapshot=snapshot, tokens=tuple(tokens))

    def release(self) -> None:
        self.slot.release()
