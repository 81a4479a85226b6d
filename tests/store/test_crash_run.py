"""``bench/crash_run.py``: a small run in CI, and proof that its audit can see a loss."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.crash_run import audit
from werk_host.store import StateStore

from .crashkit import intact
from .helpers import P1, commit, payload_for, state_dir

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "crash_run.py"
RESULT = re.compile(r"^RESULT crash_run kills=(\d+) mid_commit=(\d+) acked=(\d+) lost=(\d+) corrupt_visible=(\d+)$")


def _run(*args: str) -> tuple[int, dict[str, int], str]:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=900, cwd=SCRIPT.parents[1]
    )
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    match = RESULT.match(last)
    assert match, f"no RESULT line:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    names = ("kills", "mid_commit", "acked", "lost", "corrupt_visible")
    return proc.returncode, dict(zip(names, map(int, match.groups()), strict=True)), proc.stdout


def test_store_writer_kills_lose_nothing() -> None:
    rc, result, out = _run("--kills", "40", "--serve-kills", "0", "--seed", "7")
    assert (rc, result["lost"], result["corrupt_visible"]) == (0, 0, 0), out
    assert result["kills"] == 40 and result["acked"] > 0
    assert result["mid_commit"] > 0, out  # the kills really landed inside commits


@pytest.mark.llamaserver
def test_werk_serve_and_store_writer_kills_lose_nothing() -> None:
    from werk_llamacpp.binary import LlamaServerNotFound, find_llama_server

    try:
        find_llama_server(use_path=False)
    except LlamaServerNotFound:
        pytest.skip("no llama-server binary: set WERK_LLAMA_SERVER or run scripts/build-llama-server.sh")
    rc, result, out = _run("--kills", "40", "--serve-kills", "4", "--seed", "7")
    assert (rc, result["lost"], result["corrupt_visible"]) == (0, 0, 0), out
    serve = re.search(r"^werk serve: kills=(\d+) mid_commit=\d+ acked=(\d+) .* orphans_killed=\d+ lost=0 ", out, re.M)
    assert serve and serve.group(1) == "4" and int(serve.group(2)) > 0, out


def test_audit_reports_lost_and_corrupt_states(root: Path) -> None:
    """The audit is able to fail: a missing or damaged acknowledged state is lost, a
    damaged unacknowledged one is corrupt."""
    store = StateStore(root)
    kept, damaged, deleted, stray = (commit(store, data=payload_for(i, 5000)) for i in range(4))
    for rec in (damaged, stray):
        path = state_dir(root, P1, rec.id) / "payload.bin"
        with open(path, "r+b") as f:
            f.seek(100)
            f.write(b"\x00\x01\x02")
    assert store.delete(P1, deleted.id)
    acked = {kept.id, damaged.id, deleted.id}
    lost, corrupt, visible = audit(StateStore(root), P1, acked, acked)
    assert lost == {damaged.id, deleted.id}
    assert corrupt == {damaged.id, stray.id}
    assert visible == {kept.id, damaged.id, stray.id}


def test_writer_states_are_checked_byte_for_byte(root: Path) -> None:
    """A state whose SHA-256 matches its metadata but whose bytes are not the writer's fails."""
    store = StateStore(root)
    good = store.commit(
        P1,
        model_id="m",
        backend="b",
        compat_key={},
        payload=io.BytesIO(payload_for(3, 900)),
        adapter_meta={"seed": 3, "size": 900},
    )
    wrong = store.commit(
        P1,
        model_id="m",
        backend="b",
        compat_key={},
        payload=io.BytesIO(payload_for(4, 900)),
        adapter_meta={"seed": 3, "size": 900},
    )
    assert intact(store, P1, good.id) and intact(store, P1, good.id, (3, 900))
    assert not intact(store, P1, wrong.id)
    assert not intact(store, P1, good.id, (3, 901))
    assert not intact(store, P1, "st_" + "0" * 32)
