"""CPU expert page preparation (werk_llamacpp.prefetch; docs/deployments.md, "CPU expert page
preparation"): the tensor directory, the plan, residency before and after, the stops, and a real
llama-server whose expert pages were prepared before it spawned and dropped at its stop."""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
from werk_llamacpp import prefetch
from werk_llamacpp.gguf_meta import GgufError, read_tensors
from werk_llamacpp.process import LlamaServerError, LlamaServerProcess
from werk_llamacpp.testing.testmodel import generate_model

from werk_host.plugin.pages import PAGE, FileMapping

#: Experts big enough that every expert tensor spans many pages (4 MiB each, 12 of them).
MOE = {"dim": 256, "ffn": 512, "experts": 8, "layers": 4}


def _fresh(path: Path) -> Path:
    """Written through to disk (clean pages), then dropped from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return path


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _fresh(generate_model(tmp_path_factory.mktemp("moe") / "moe.gguf", **MOE))


def _planned(model: Path, *flags: str) -> prefetch.Plan:
    planned = prefetch.plan(["-m", str(model), *flags])
    assert isinstance(planned, prefetch.Plan), planned
    return planned


def _mapped(path: Path) -> int:
    """This process's mappings of ``path``."""
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if line.rstrip().endswith(str(path)))


def _leased(path: Path) -> bool:
    """Whether someone holds a lease on ``path`` (an exclusive lease is refused)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _resident_pages(path: Path) -> list[bool]:
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        with FileMapping(fd, 0, size) as whole:
            return [whole.resident(at, min(PAGE, size - at)) > 0 for at in range(0, size, PAGE)]
    finally:
        os.close(fd)


def _complete_pages(start: int, end: int) -> range:
    return range(-(-start // PAGE), end // PAGE)


# -- the tensor directory ----------------------------------------------------------------------


def test_the_tensor_directory_agrees_with_gguf(moe_model: Path) -> None:
    directory = read_tensors(moe_model)
    reader = gguf.GGUFReader(moe_model)
    assert [t.name for t in directory.tensors] == [t.name for t in reader.tensors]
    for mine, theirs in zip(directory.tensors, reader.tensors, strict=True):
        assert directory.span(mine) == (int(theirs.data_offset), int(theirs.data_offset) + int(theirs.n_bytes))
        assert mine.dims == tuple(int(d) for d in theirs.shape)
        assert mine.ggml_type == int(theirs.tensor_type)
    exps = [t for t in directory.tensors if "_exps" in t.name]
    assert len(exps) == 3 * MOE["layers"] and all(len(t.dims) == 3 and t.nbytes == 4 << 20 for t in exps)
    assert directory.alignment == 32 and directory.data_start % 32 == 0
    assert directory.metadata["llama.expert_count"] == 8 and directory.metadata["llama.expert_used_count"] == 2


def test_the_directory_knows_scalar_i32_and_refuses_what_it_does_not_know(tmp_path: Path) -> None:
    path = tmp_path / "scalar.gguf"
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_tensor("a.weight", np.ones((3, 64), dtype=np.float32))
    writer.add_tensor("n.scalar", np.array(7, dtype=np.int32))
    writer.add_tensor("b.weight", np.ones((2, 32), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    directory = read_tensors(path)
    scalar = directory.tensors[1]
    assert (scalar.dims, scalar.ggml_type, scalar.nbytes) == ((), 26, 4)
    theirs = gguf.GGUFReader(path).tensors[1]
    assert directory.span(scalar)[0] == int(theirs.data_offset)
    with pytest.raises(GgufError, match="tensors"):
        read_tensors(path, max_tensors=2)
    data = bytearray(path.read_bytes())
    at = data.index(b"b.weight") + len(b"b.weight") + 4 + 8 * 2  # name, n_dims, two dims: the type
    struct.pack_into("<I", data, at, 99)
    (tmp_path / "unknown.gguf").write_bytes(bytes(data))
    with pytest.raises(GgufError, match="ggml type 99"):
        read_tensors(tmp_path / "unknown.gguf")


def test_the_moe_model_is_deterministic_and_the_dense_default_unchanged(tmp_path: Path) -> None:
    a = generate_model(tmp_path / "a.gguf", dim=64, ffn=128, experts=4, experts_used=2)
    b = generate_model(tmp_path / "b.gguf", dim=64, ffn=128, experts=4, experts_used=2)
    assert a.read_bytes() == b.read_bytes()
    names = [t.name for t in read_tensors(a).tensors]
    assert "blk.0.ffn_gate_inp.weight" in names and "blk.0.ffn_gate.weight" not in names
    dense = [t.name for t in read_tensors(generate_model(tmp_path / "d.gguf")).tensors]
    assert "blk.0.ffn_gate.weight" in dense and not any("exps" in n for n in dense)
    with pytest.raises(ValueError):
        generate_model(tmp_path / "x.gguf", experts=1)
    with pytest.raises(ValueError):
        generate_model(tmp_path / "x.gguf", experts=2, experts_used=3)


# -- the plan -------------------------------------------------------------------------------------


def test_cpu_moe_selects_every_layer_and_only_complete_pages(moe_model: Path) -> None:
    for flag in ("--cpu-moe", "-cmoe"):
        planned = _planned(moe_model, flag)
        assert planned.selection == "--cpu-moe"
        assert len(planned.tensors) == 12 and all("_exps" in n for n in planned.tensors)
    directory = read_tensors(moe_model)
    spans = [directory.span(t) for t in directory.tensors if t.name in planned.tensors]
    for run in planned.runs:
        assert run.start % PAGE == 0 and run.length % PAGE == 0 and run.length > 0
        assert any(start <= run.start and run.start + run.length <= end for start, end in spans)
    assert planned.page_bytes == sum(len(_complete_pages(s, e)) * PAGE for s, e in spans)
    assert planned.tensor_bytes - planned.page_bytes < 2 * PAGE * len(spans)


def test_n_cpu_moe_selects_the_first_layers(moe_model: Path) -> None:
    for flags in (("--n-cpu-moe", "2"), ("-ncmoe", "2"), ("--n-cpu-moe=2",)):
        planned = _planned(moe_model, *flags)
        assert planned.selection == "--n-cpu-moe 2"
        assert sorted({n.split(".")[1] for n in planned.tensors}) == ["0", "1"] and len(planned.tensors) == 6
    assert len(_planned(moe_model, "--n-cpu-moe", "99").tensors) == 12
    assert len(_planned(moe_model, "--n-cpu-moe", "1", "--cpu-moe").tensors) == 12


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        ((), "no CPU-placed experts"),
        (("--n-cpu-moe", "0"), "no CPU-placed experts"),
        (("--cpu-moe", "-ot", "exps=CPU"), "tensor override"),
        (("--cpu-moe", "--override-tensor=exps=CPU"), "tensor override"),
        (("--cpu-moe", "--numa", "distribute"), "NUMA"),
        (("--cpu-moe", "--no-mmap"), "alternative loading mode (--no-mmap)"),
        (("--cpu-moe", "--mlock"), "alternative loading mode (--mlock)"),
        (("--cpu-moe", "--load-mode", "dio"), "alternative loading mode"),
        (("--cpu-moe", "--direct-io"), "alternative loading mode"),
        (("--cpu-moe", "--override-kv", "llama.expert_count=int:4"), "metadata override"),
        (("--n-cpu-moe", "two"), "not a layer count"),
    ],
)
def test_the_plan_abstains(moe_model: Path, flags: tuple[str, ...], reason: str) -> None:
    planned = prefetch.plan(["-m", str(moe_model), *flags])
    assert isinstance(planned, prefetch.Abstention) and reason in planned.reason


def test_the_plan_abstains_for_dense_models_other_systems_and_bad_files(
    moe_model: Path, tiny_model: Path, tmp_path: Path
) -> None:
    dense = prefetch.plan(["-m", str(tiny_model), "--cpu-moe"])
    assert isinstance(dense, prefetch.Abstention) and "not a mixture-of-experts model" in dense.reason
    other = prefetch.plan(["-m", str(moe_model), "--cpu-moe"], platform="darwin")
    assert isinstance(other, prefetch.Abstention) and other.reason == "not Linux"
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file")
    junk = prefetch.plan(["-m", str(tmp_path / "junk.gguf"), "--cpu-moe"])
    assert isinstance(junk, prefetch.Abstention) and "unsupported GGUF metadata" in junk.reason
    split = prefetch.plan(["-m", str(tmp_path / "m-00001-of-00002.gguf"), "--cpu-moe"])
    assert isinstance(split, prefetch.Abstention) and "unsupported GGUF metadata" in split.reason


def test_model_shards_and_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    assert prefetch.model_shards(Path("/m/x.gguf")) == (Path("/m/x.gguf"),)
    assert prefetch.model_shards(Path("/m/x-00002-of-00003.gguf")) == tuple(
        Path(f"/m/x-0000{k}-of-00003.gguf") for k in (1, 2, 3)
    )
    assert prefetch.prefetch_mode({}) == "auto" and prefetch.prefetch_mode({"WERK_LLAMA_PREFETCH": "off"}) == "off"
    with pytest.raises(prefetch.PrefetchConfigError, match="WERK_LLAMA_PREFETCH"):
        prefetch.prefetch_mode({"WERK_LLAMA_PREFETCH": "always"})


def test_memory_room_takes_the_least_of_host_and_cgroup(tmp_path: Path) -> None:
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal: 9000 kB\nMemAvailable:    4000 kB\n")
    (proc / "self" / "cgroup").write_text("0::/a/b\n")
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "memory.max").write_text("max\n")
    (root / "a" / "b" / "memory.current").write_text("100\n")
    assert prefetch.memory_room(proc, root) == 4000 * 1024
    (root / "a" / "memory.max").write_text("3000\n")
    (root / "a" / "memory.current").write_text("1000\n")
    assert prefetch.memory_room(proc, root) == 2000


# -- the preparation ---------------------------------------------------------------------------


@pytest.fixture
def prepared_file(tmp_path: Path) -> Iterator[Path]:
    yield generate_model(tmp_path / "moe.gguf", **MOE)


def test_prepare_makes_the_expert_pages_resident_and_leaves_dense_ones(prepared_file: Path) -> None:
    planned = _planned(prepared_file, "--cpu-moe")
    _fresh(prepared_file)  # after planning: reading the header brought its own pages in
    assert not any(_resident_pages(prepared_file))
    prep = prefetch.prepare(planned, chunk_bytes=1 << 20)
    try:
        out = prep.outcome
        assert out.status == "prepared", out
        assert out.checked_bytes == planned.page_bytes == out.retained_bytes == prep.retained_bytes
        assert out.prefaulted_bytes <= out.missing_bytes <= out.checked_bytes and out.missing_bytes > 0
        assert out.method in ("madvise", "touch") and out.tensors == 12
        resident = _resident_pages(prepared_file)
        selected = {p for r in planned.runs for p in range(r.start // PAGE, (r.start + r.length) // PAGE)}
        assert sum(resident[p] for p in selected) == len(selected)
        directory = read_tensors(prepared_file)
        dense = {
            p for t in directory.tensors if t.name not in planned.tensors for p in _complete_pages(*directory.span(t))
        }
        assert len(dense) > 200 and sum(resident[p] for p in dense) <= 8  # a readahead tolerance of 8 pages
        assert _mapped(prepared_file) == len(planned.runs) and _leased(prepared_file)
    finally:
        prep.close()
    assert _mapped(prepared_file) == 0 and not _leased(prepared_file) and prep.retained_bytes == 0


def test_a_zero_deadline_stops_after_the_first_chunk(prepared_file: Path) -> None:
    planned = _planned(prepared_file, "--cpu-moe")
    _fresh(prepared_file)
    prep = prefetch.prepare(planned, deadline_s=0, chunk_bytes=1 << 20)
    out = prep.outcome
    assert (out.status, out.reason, out.retained_bytes) == ("stopped", "deadline", 0)
    assert 0 < out.prefaulted_bytes <= 1 << 20 and out.checked_bytes == planned.page_bytes
    assert _mapped(prepared_file) == 0 and not _leased(prepared_file)
    assert sum(_resident_pages(prepared_file)) <= (1 << 20) // PAGE + 8


def test_cancellation_memory_and_missing_lease_stop_it(prepared_file: Path) -> None:
    planned = _planned(prepared_file, "--cpu-moe")
    _fresh(prepared_file)
    cancel = threading.Event()
    cancel.set()
    out = prefetch.prepare(planned, cancel=cancel).outcome
    assert (out.status, out.reason, out.prefaulted_bytes) == ("stopped", "cancelled", 0)
    out = prefetch.prepare(planned, room=lambda: 1024).outcome
    assert out.status == "stopped" and out.reason is not None and out.reason.startswith("memory budget")
    rooms = iter([1 << 40])
    out = prefetch.prepare(planned, room=lambda: next(rooms, 0)).outcome
    assert (out.status, out.reason, out.prefaulted_bytes) == ("stopped", "memory pressure", 0)
    holder = os.open(prepared_file, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)  # a release in progress elsewhere: no lease is granted
        out = prefetch.prepare(planned).outcome
        assert out.status == "stopped" and "lease" in (out.reason or "") and out.retained_bytes == 0
    finally:
        os.close(holder)
    with open(prepared_file, "ab") as grown:
        grown.write(b"\0")
    out = prefetch.prepare(planned).outcome
    assert (out.status, out.reason) == ("stopped", "the model file changed since it was planned")
    assert _mapped(prepared_file) == 0 and not _leased(prepared_file)


def test_off_does_nothing(moe_model: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="werk_llamacpp.prefetch")
    prep = prefetch.prepare_for(["-m", str(moe_model), "--cpu-moe"], environ={"WERK_LLAMA_PREFETCH": "off"})
    assert prep.outcome.status == "off" and prep.lease is None and not prep.mappings
    assert _mapped(moe_model) == 0 and not _leased(moe_model)
    assert "prefetch: abstained: WERK_LLAMA_PREFETCH=off" in caplog.text
    prep = prefetch.prepare_for(["-m", str(moe_model)], environ={})
    assert prep.outcome.as_dict()["status"] == "abstained"
    assert "prefetch: abstained: no CPU-placed experts" in caplog.text


# -- a real llama-server --------------------------------------------------------------------------


@pytest.mark.llamaserver
def test_a_real_server_starts_on_prepared_expert_pages(
    llama_server_path: Path, prepared_file: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WERK_LLAMA_PREFETCH", raising=False)
    caplog.set_level(logging.INFO, logger="werk_llamacpp.prefetch")
    _fresh(prepared_file)
    proc = LlamaServerProcess(prepared_file, binary=llama_server_path, ctx=512, env_args="", extra_args=["--cpu-moe"])
    proc.start()
    try:
        out = proc.prefetch
        assert out is not None and out.status == "prepared" and out.prefaulted_bytes > 0, out
        assert out.retained_bytes == out.checked_bytes > 0
        assert "prefetch: 12 expert tensors, checked" in caplog.text
        assert _mapped(prepared_file) > 0 and _leased(prepared_file)
        client = proc.new_client()
        try:
            assert client.completion("hello model", n_predict=4, ignore_eos=True).predicted_n == 4
        finally:
            client.close()
    finally:
        proc.stop()
    assert _mapped(prepared_file) == 0 and not _leased(prepared_file)
    assert proc.prefetch is not None and proc.prefetch.as_dict()["status"] == "prepared"


@pytest.mark.llamaserver
def test_a_real_server_with_prefetch_off_or_unknown(
    llama_server_path: Path, moe_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WERK_LLAMA_PREFETCH", "off")
    with LlamaServerProcess(moe_model, binary=llama_server_path, ctx=512, env_args="--cpu-moe") as proc:
        assert proc.prefetch is not None and proc.prefetch.status == "off"
        assert _mapped(moe_model) == 0 and not _leased(moe_model)
    monkeypatch.setenv("WERK_LLAMA_PREFETCH", "sometimes")
    with pytest.raises(LlamaServerError, match="WERK_LLAMA_PREFETCH must be one of auto, off"):
        LlamaServerProcess(moe_model, binary=llama_server_path, ctx=512, env_args="--cpu-moe").start()
