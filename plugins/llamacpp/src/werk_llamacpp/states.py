"""Named states on llama.cpp: prefill, snapshot, restore, decode and release on the state slot.

:class:`StateOperations` implements those operations (``werk_prefill``, ``werk_snapshot``,
``werk_restore``, ``werk_decode``, ``werk_release_state``; ``werk_state_move`` is unsupported:
the states live on disk only) for :class:`~werk_llamacpp.adapter.LlamaCppAdapter`, by the state
model of :mod:`werk_llamacpp.adapter` (docs/architecture.md, "llama.cpp slot use"): every call
holds the slot lock, requires a child answering ``/health`` and a passed functional probe, and
restores a state from its local or stored snapshot when the slot no longer holds it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from werk_host.plugin import (
    DecodeOutput,
    DecodeWork,
    ErrorCode,
    MessagesInput,
    MoveOutput,
    MoveWork,
    PrefilledState,
    PrefillWork,
    Snapshot,
    StoredStateRef,
    WerkError,
    hookimpl,
)

from .core import STATE_WORK_TIMEOUT_S, LlamaServerCore, unavailable
from .integrity import path_tokens, tokens_digest, tokens_equal
from .native import LlamaServerClient, NativeConnectionError, NativeError
from .process import LlamaServerProcess
from .snapshot import SlotImage, check_compatible, presented, read_image, verify_tokens

log = logging.getLogger(__name__)

#: Bytes per chunk of a streamed snapshot.
CHUNK = 1 << 20


@dataclass
class LlamaHandle:
    """A prefilled state: its exact prompt tokens (and their keyed digest), producing generation
    and local snapshot."""

    token: str
    tokens: list[int]
    generation: str
    n_saved: int
    n_written: int
    tokens_hmac: str
    snapshot: Path | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return f"LlamaHandle(tokens={len(self.tokens)}, generation={self.generation[:8]})"


def own_handle(handle: object) -> LlamaHandle:
    """``handle`` as this adapter's own type (the host hands back only what prefill returned)."""
    if not isinstance(handle, LlamaHandle):
        raise WerkError(ErrorCode.INTERNAL, "the host passed a state handle this adapter did not create")
    return handle


class StateOperations(LlamaServerCore):
    """The named-state operations of the llama.cpp adapter (module docstring)."""

    def render_prompt(self, client: LlamaServerClient, work: PrefillWork) -> list[int]:
        if isinstance(work.input, MessagesInput):
            text = client.apply_template([m.model_dump(mode="json") for m in work.input.messages])
        else:
            text = work.input.text
        return client.tokenize(text, add_special=True, parse_special=isinstance(work.input, MessagesInput))

    @hookimpl(specname="werk_prefill")
    def prefill(self, work: PrefillWork) -> PrefilledState:
        if work.model_id != self.manifest.name:
            raise WerkError(ErrorCode.NOT_FOUND, "model is not served by this adapter")
        with self.slot_lock:
            proc = self.process()
            self.check_answering(proc)
            self.ensure_probed(proc)
            client, slot = self.client(proc), self.state_slot
            try:
                tokens = self.render_prompt(client, work)
                slot_ctx = self.context_per_slot(proc)
                if slot_ctx is not None and len(tokens) >= slot_ctx:
                    raise WerkError(
                        ErrorCode.RESOURCE_EXHAUSTED,
                        f"prompt has {len(tokens)} tokens; a slot holds {slot_ctx}",
                        retryable=False,
                    )
                done = client.completion(
                    tokens, id_slot=slot, n_predict=0, cache_prompt=True, timeout=STATE_WORK_TIMEOUT_S
                )
                if done.tokens_evaluated != len(tokens):
                    raise unavailable("llama-server evaluated a different prompt length; retry")
                token = secrets.token_hex(16)
                filename = f"werk-state-{token}.bin"
                saved = client.slot_save(slot, filename)
            except NativeError as err:
                self._slot_owner = None
                raise self.native_failure(err, "prefill") from err
            self._slot_owner = token
            assert proc.slot_dir is not None
            path = proc.slot_dir / filename
            try:
                held = path_tokens(path, saved.n_written) if os.lstat(path).st_size == saved.n_written else None
            except (OSError, WerkError):
                held = None
            if saved.n_saved != len(tokens) or held != tokens:
                # Never stored: the slot file does not hold exactly the prompt Werk evaluated.
                path.unlink(missing_ok=True)
                self._slot_owner = None
                log.error("llama-server saved a slot that does not hold the prefilled prompt; nothing is stored")
                raise unavailable("the state slot did not hold the prefilled prompt when it was saved; retry")
            digest = tokens_digest(self.token_key, tokens)
            handle = LlamaHandle(token, tokens, proc.generation, saved.n_saved, saved.n_written, digest, path)
            return PrefilledState(
                handle=handle,
                prompt_tokens=len(tokens),
                compat_key=self.compat_key_of(proc),
                snapshot_capable=True,
                bytes=saved.n_written,
                adapter_meta={
                    "n_tokens": saved.n_saved,
                    "n_bytes": saved.n_written,
                    "producer_generation": proc.generation,
                    "tokens_hmac": digest,
                },
            )

    @hookimpl(specname="werk_snapshot")
    def snapshot(self, state: PrefilledState) -> Snapshot:
        """The state's slot file followed by Werk's trailer (:mod:`.snapshot`), streamed."""
        handle = own_handle(state.handle)
        if handle.snapshot is None:
            raise WerkError(ErrorCode.UNAVAILABLE, "the state's local snapshot is gone", retryable=False)
        trailer = SlotImage(handle.tokens, handle.n_saved, handle.n_written, handle.tokens_hmac).trailer()
        path = handle.snapshot

        def chunks() -> Iterator[bytes]:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as source:
                while chunk := source.read(CHUNK):
                    yield chunk
            yield trailer

        def close() -> None:
            # The store now owns the bytes; decode restores from it if the slot moved on.
            path.unlink(missing_ok=True)
            handle.snapshot = None

        return Snapshot(chunks=chunks(), size=handle.n_written + len(trailer), close=close)

    def restore_slot_file(self, proc: LlamaServerProcess, name: str, n_saved: int, n_written: int) -> str:
        """Restore the slot file ``name`` (in the private slot directory) into the state slot and
        require the exact acknowledgement; returns the new slot owner token.

        A rejected or mis-acknowledged snapshot is ``corrupt_state`` (the slot is erased); a dead
        child is ``unavailable``. (llama-server defers a restore on a busy slot until it is idle.)"""
        client, slot = self.client(proc), self.state_slot
        self._slot_owner = None
        try:
            restored = client.slot_restore(slot, name)
        except NativeError as err:
            with contextlib.suppress(NativeError):
                client.slot_erase(slot)
            if isinstance(err, NativeConnectionError):
                raise self.native_failure(err, "restore") from err
            raise WerkError(ErrorCode.CORRUPT_STATE, "llama-server rejected the snapshot") from err
        if restored.n_restored != n_saved or restored.n_read != n_written:
            with contextlib.suppress(NativeError):
                client.slot_erase(slot)
            raise WerkError(ErrorCode.CORRUPT_STATE, "restore acknowledgement does not match the snapshot")
        token = secrets.token_hex(16)
        self._slot_owner = token
        return token

    def _restore_stored(self, proc: LlamaServerProcess, stored: StoredStateRef) -> LlamaHandle:
        """Restore a stored state, whichever generation wrote it, into the state slot.

        The caller holds the slot lock and ran :meth:`ensure_probed` for ``proc``. Requires the
        stored compatibility key to equal this process's exactly (``incompatible_state``
        with ``mismatch_fields`` otherwise); the payload arrives size- and SHA-256-verified from
        the store; its trailer must add up and llama-server's acknowledgement must be exact
        (``corrupt_state`` otherwise). The verified bytes are handed over without a copy where
        the platform allows (:func:`.snapshot.presented`). Before llama-server reads it, the slot
        file's token ids must equal the trailer's, the trailer's digest must verify under this
        adapter's key and equal the one recorded at commit (``corrupt_state`` otherwise)."""
        check_compatible(stored, self.compat_key_of(proc), "stored state")
        assert proc.slot_dir is not None
        with stored.open_payload() as payload:
            fd = payload.fileno()
            image = read_image(fd, os.fstat(fd).st_size)
            verify_tokens(fd, image, self.token_key)
            recorded = stored.adapter_meta.get("tokens_hmac")
            if recorded is not None and recorded != image.tokens_hmac:
                raise WerkError(
                    ErrorCode.CORRUPT_STATE, "the snapshot's token digest is not the one recorded at commit"
                )
            with presented(proc.slot_dir, fd, image.n_written) as name:
                token = self.restore_slot_file(proc, name, image.n_saved, image.n_written)
        return LlamaHandle(token, image.tokens, proc.generation, image.n_saved, image.n_written, image.tokens_hmac)

    def _check_local(self, handle: LlamaHandle, path: Path) -> None:
        """``corrupt_state`` unless the local slot file holds exactly the handle's tokens, whose
        digest is the one recorded when it was saved."""
        try:
            held = path_tokens(path, handle.n_written)
        except OSError as err:
            raise unavailable("the state's local snapshot is gone") from err
        if held != handle.tokens or not tokens_equal(self.token_key, handle.tokens, handle.tokens_hmac):
            raise WerkError(ErrorCode.CORRUPT_STATE, "the local slot file holds other tokens than the state")

    @hookimpl(specname="werk_restore")
    def restore(self, stored: StoredStateRef) -> PrefilledState:
        with self.slot_lock:
            proc = self.process()
            self.check_answering(proc)
            self.ensure_probed(proc)
            handle = self._restore_stored(proc, stored)
            return PrefilledState(handle, len(handle.tokens), self.compat_key_of(proc), True, bytes=handle.n_written)

    @hookimpl(specname="werk_decode")
    def decode(self, work: DecodeWork) -> DecodeOutput:
        """Generate from a handed-off state: the live slot when it still holds the state, else
        the state's local slot file (same generation), else the stored payload (any generation
        with an equal compatibility key, after this generation's probe passed)."""
        with self.slot_lock:
            proc = self.process()
            self.check_answering(proc)
            self.ensure_probed(proc)
            given = own_handle(work.handle) if work.handle is not None else None
            handle = given
            source = "live"
            if handle is None or handle.generation != proc.generation or handle.token != self._slot_owner:
                if handle is not None and handle.snapshot is not None and handle.generation == proc.generation:
                    self._check_local(handle, handle.snapshot)
                    token = self.restore_slot_file(proc, handle.snapshot.name, handle.n_saved, handle.n_written)
                    handle = LlamaHandle(
                        token, handle.tokens, proc.generation, handle.n_saved, handle.n_written, handle.tokens_hmac
                    )
                    source = "local"
                elif work.stored is not None:
                    handle = self._restore_stored(proc, work.stored)
                    source = "stored"
                else:
                    raise unavailable("the live state is gone and no snapshot exists")
            opts = work.options
            try:
                done = self.client(proc).completion(
                    handle.tokens,
                    id_slot=self.state_slot,
                    n_predict=opts.max_tokens,
                    cache_prompt=True,
                    temperature=opts.temperature,
                    top_p=opts.top_p,
                    seed=opts.seed,
                    stop=list(opts.stop) or None,
                    timeout=STATE_WORK_TIMEOUT_S,
                )
            except NativeError as err:
                raise self.native_failure(err, "decode") from err
            finally:
                self._slot_owner = None  # the slot now also holds generated tokens
                if given is not None and given.snapshot is not None:
                    given.snapshot.unlink(missing_ok=True)
                    given.snapshot = None
            self.last_decode = {
                "restored": source != "live",
                "source": source,
                "prompt_tokens": len(handle.tokens),
                "cache_n": done.cache_n,
                "prompt_n": done.prompt_n,
                "predicted_n": done.predicted_n,
            }
            return DecodeOutput(
                text=done.content,
                completion_tokens=done.predicted_n or 0,
                finish_reason=done.finish_reason or "stop",
            )

    @hookimpl(specname="werk_release_state")
    def release(self, handle: object) -> bool:
        if isinstance(handle, LlamaHandle) and handle.snapshot is not None:
            handle.snapshot.unlink(missing_ok=True)
            handle.snapshot = None
            return True
        return False

    @hookimpl(specname="werk_state_move")
    def state_move(self, work: MoveWork) -> MoveOutput:
        """Unsupported: named states live on disk only (no ram/vram tiers)."""
        raise WerkError(
            ErrorCode.UNSUPPORTED, "llama.cpp named states live on disk only; ram/vram tiers are unsupported"
        )
