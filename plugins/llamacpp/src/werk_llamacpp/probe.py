"""Functional probe of slot state on one live llama-server process generation.

:func:`run_probe` proves end to end, against the exact running process, that
named slot state works: prefill a private slot → save → erase → restore →
replay, and checks the counters the server acknowledges (see
``NATIVE_NOTES.md``). Checks, in order (each is recorded in
``evidence["checks"]``; the first failing one ends the probe):

* ``process_alive``; ``slot_in_range``: the probe slot (default: the last one)
  is below the ``-np`` of the *final* argv; ``explicit_slots_match_server``:
  ``/props`` ``total_slots`` equals that ``-np``; ``private_slot_save_path``:
  the final argv still selects the process's private snapshot directory;
* prefill (a per-probe nonce at the front of the prompt keeps it out of
  every other cache): ``tokens_evaluated`` = N > 1 and
  ``prompt_n`` + ``cache_n`` = N;
* save: ``n_saved`` ≥ N, ``n_written`` > 0, and the snapshot file in the
  private directory has exactly ``n_written`` bytes; ``slot_file_tokens``: the file's header
  (:mod:`werk_llamacpp.integrity`) lists exactly ``n_saved`` token ids, so the token
  verification of every save and restore reads this server's files as they are;
* erase: ``n_erased`` = ``n_saved``;
* restore of that snapshot in Werk's stored format (the slot file followed by Werk's trailer,
  handed over by :func:`werk_llamacpp.snapshot.presented`, as every stored state is):
  ``n_restored`` = ``n_saved`` and ``n_read`` = ``n_written``;
* replay of the same prompt (``cache_prompt``): ``tokens_evaluated`` = N,
  ``cache_n`` + ``prompt_n`` = N, ``cache_n`` ≥ N − 1, ``prompt_n`` ≤ 1 and
  fewer tokens computed than by the prefill. llama-server always recomputes
  the last prompt token to get logits, so ``prompt_n`` = 1 with
  ``cache_n`` = N − 1 proves the prefix came from the restored state. (A
  replay after an erase *without* restore reports ``cache_n`` = 0.)

Only a passed probe may turn the state capabilities of that process
generation to ``experimental``. The snapshot file is always removed and the
probe slot erased afterwards. Backend errors never raise: they give
``passed=False`` with the error in ``evidence["error"]``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from werk_host.plugin import WerkError

from .integrity import path_tokens
from .native import Completion, LlamaServerClient, NativeError
from .process import LlamaServerProcess
from .snapshot import SlotImage, presented

__all__ = ["DEFAULT_PROBE_PROMPT", "ProbeResult", "run_probe"]

DEFAULT_PROBE_PROMPT = (
    "Werk probe: the model will save this slot state, erase the slot, restore the state "
    "and replay the same prompt from the restored cache."
)


@dataclass(frozen=True)
class ProbeResult:
    """Outcome of :func:`run_probe`. ``evidence`` holds the observed counters and checks."""

    passed: bool
    evidence: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None


class _ProbeFailed(Exception):
    pass


def _counters(c: Completion) -> dict[str, Any]:
    return {
        "tokens_evaluated": c.tokens_evaluated,
        "tokens_cached": c.tokens_cached,
        "cache_n": c.cache_n,
        "prompt_n": c.prompt_n,
        "predicted_n": c.predicted_n,
        "prompt_ms": c.prompt_ms,
        "stop_type": c.stop_type,
        "first_tokens": c.tokens[:1],
    }


def run_probe(
    process: LlamaServerProcess,
    *,
    id_slot: int | None = None,
    prompt: str = DEFAULT_PROBE_PROMPT,
    timeout: float = 60.0,
) -> ProbeResult:
    """Run the save → erase → restore → replay probe on ``process``; never raises for backend failures.

    ``id_slot`` defaults to the last slot of the final argv (``effective_parallel() - 1``);
    the caller must ensure no other request uses that slot meanwhile.
    """
    evidence: dict[str, Any] = {"checks": {}}
    checks: dict[str, bool] = evidence["checks"]

    def check(name: str, ok: bool, detail: str) -> None:
        checks[name] = ok
        if not ok:
            raise _ProbeFailed(f"{name}: {detail}")

    snapshot: Path | None = None
    client: LlamaServerClient | None = None
    slot = -1
    t0 = time.monotonic()
    try:
        check("process_alive", process.alive() and process.port is not None, "llama-server is not running")
        evidence["fingerprints"] = process.fingerprints()
        n_par = process.effective_parallel()
        slot = n_par - 1 if id_slot is None else id_slot
        evidence["id_slot"] = slot
        evidence["effective_parallel"] = n_par
        check("slot_in_range", 0 <= slot < n_par, f"slot {slot} outside 0..{n_par - 1}")
        check(
            "explicit_slots_match_server",
            process.total_slots == n_par,
            f"final argv selects {n_par} slots, the server reports {process.total_slots}",
        )
        eff_dir = process.effective_slot_save_path()
        private = process.slot_dir
        check(
            "private_slot_save_path",
            eff_dir is not None and private is not None and eff_dir.resolve() == private.resolve(),
            f"final argv selects --slot-save-path {eff_dir}, not the private directory",
        )
        assert private is not None

        client = process.new_client(timeout=timeout, n_slots=n_par)
        nonce = secrets.token_hex(8)
        filename = f"werk-probe-{nonce}.bin"
        snapshot = private / filename
        # A per-probe nonce at the front keeps the prompt out of every other cache
        # (other slots, llama-server's host-memory prompt cache): after the erase,
        # the restored snapshot is the only place its KV state can come from.
        text = f"[{nonce}] {prompt}"

        # 1. prefill the private slot (1 greedy token so the slot has a completed task)
        prefill = client.completion(
            text, id_slot=slot, n_predict=1, cache_prompt=True, temperature=0.0, return_tokens=True
        )
        evidence["prefill"] = _counters(prefill)
        n_prompt = prefill.tokens_evaluated
        check("prefill_counted", isinstance(n_prompt, int) and n_prompt > 1, f"tokens_evaluated={n_prompt}")
        assert n_prompt is not None
        check(
            "prefill_consistent",
            prefill.prompt_n is not None
            and prefill.prompt_n + (prefill.cache_n or 0) == n_prompt
            and prefill.prompt_n > 1,
            f"prefill computed prompt_n={prefill.prompt_n} cache_n={prefill.cache_n} of {n_prompt}",
        )
        assert prefill.prompt_n is not None

        # 2. save
        saved = client.slot_save(slot, filename)
        evidence["save"] = {"n_saved": saved.n_saved, "n_written": saved.n_written, "save_ms": saved.save_ms}
        check(
            "save_counts",
            saved.n_saved >= n_prompt and saved.n_written > 0,
            f"n_saved={saved.n_saved} n_written={saved.n_written} for {n_prompt} prompt tokens",
        )
        try:
            size = os.lstat(snapshot).st_size
        except OSError as exc:
            raise _ProbeFailed(f"snapshot_file: not found in the private directory ({exc.strerror})") from exc
        evidence["snapshot_bytes"] = size
        check("snapshot_size", size == saved.n_written, f"file has {size} bytes, server wrote {saved.n_written}")
        try:
            listed = len(path_tokens(snapshot, saved.n_written))
        except WerkError as exc:
            raise _ProbeFailed(f"slot_file_tokens: {exc.message}") from exc
        check("slot_file_tokens", listed == saved.n_saved, f"file lists {listed} tokens, server saved {saved.n_saved}")

        # 3. erase
        erased = client.slot_erase(slot)
        evidence["erase"] = {"n_erased": erased.n_erased}
        check("erase_counts", erased.n_erased == saved.n_saved, f"n_erased={erased.n_erased} n_saved={saved.n_saved}")

        # 4. restore, exactly as a stored state is restored: the slot file followed by Werk's
        # trailer (snapshot format v3), handed over through snapshot.presented. The trailer's
        # content is Werk's own and never read by llama-server; the acknowledgement must show
        # that llama-server read the slot file's bytes and not one more.
        trailer = SlotImage([0] * saved.n_saved, saved.n_saved, saved.n_written, "0" * 64).trailer()
        with open(snapshot, "ab") as extend:
            extend.write(trailer)
        fd = os.open(snapshot, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            with presented(private, fd, saved.n_written) as name:
                restored = client.slot_restore(slot, name)
        finally:
            os.close(fd)
        evidence["restore"] = {
            "n_restored": restored.n_restored,
            "n_read": restored.n_read,
            "restore_ms": restored.restore_ms,
        }
        check(
            "restore_tokens",
            restored.n_restored == saved.n_saved,
            f"n_restored={restored.n_restored} n_saved={saved.n_saved}",
        )
        check(
            "restore_bytes", restored.n_read == saved.n_written, f"n_read={restored.n_read} n_written={saved.n_written}"
        )

        # 5. replay the same prompt from the restored state
        replay = client.completion(
            text, id_slot=slot, n_predict=1, cache_prompt=True, temperature=0.0, return_tokens=True
        )
        evidence["replay"] = _counters(replay)
        cache_n, prompt_n = replay.cache_n, replay.prompt_n
        check(
            "replay_counted",
            replay.tokens_evaluated == n_prompt and cache_n is not None and prompt_n is not None,
            f"tokens_evaluated={replay.tokens_evaluated} cache_n={cache_n} prompt_n={prompt_n}",
        )
        assert cache_n is not None and prompt_n is not None
        check(
            "replay_consistent",
            cache_n + prompt_n == n_prompt,
            f"cache_n {cache_n} + prompt_n {prompt_n} != {n_prompt}",
        )
        check(
            "replay_from_cache",
            cache_n >= n_prompt - 1 and prompt_n <= 1 and prompt_n < prefill.prompt_n,
            f"only {cache_n} of {n_prompt} prompt tokens came from the restored state (recomputed {prompt_n})",
        )
        # Informational: greedy first token after restore vs. the original one. Not a
        # pass criterion (logits of a single-token batch may differ in the last bits).
        evidence["first_token_match"] = bool(prefill.tokens[:1]) and prefill.tokens[:1] == replay.tokens[:1]
        evidence["elapsed_ms"] = round((time.monotonic() - t0) * 1000.0, 3)
        return ProbeResult(True, evidence, None)
    except _ProbeFailed as exc:
        evidence["elapsed_ms"] = round((time.monotonic() - t0) * 1000.0, 3)
        return ProbeResult(False, evidence, str(exc))
    except NativeError as exc:
        evidence["elapsed_ms"] = round((time.monotonic() - t0) * 1000.0, 3)
        evidence["error"] = {"type": type(exc).__name__, "endpoint": exc.endpoint, "message": str(exc)}
        return ProbeResult(False, evidence, f"llama-server error: {exc}")
    finally:
        if snapshot is not None:
            try:
                os.unlink(snapshot)
            except FileNotFoundError:
                pass
            except OSError:
                evidence["cleanup_error"] = True
        if client is not None:
            if slot >= 0:
                with contextlib.suppress(NativeError):
                    client.slot_erase(slot)
            client.close()
