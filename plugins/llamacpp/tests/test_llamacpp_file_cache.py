"""The model-lifetime guard over a real llama-server (docs/operations.md, "Model file cache").

While an instance is loaded its GGUF holds Werk's shared lease; an operator's unload first
stops the llama-server child, then, with ``model_cache_release = "on"``, drops the file's pages
from the page cache (``mincore`` over the file falls to almost nothing), and with ``off`` keeps
them. Another Werk reader's lease keeps them too, and the inventory and the instance log say
why; on a generated model and on SmolLM2. With CPU experts (``--cpu-moe``, a generated MoE
GGUF) the expert page preparation's mappings are dropped before the release, which then drops
the whole file. A ``werk serve`` killed with SIGKILL (and a child killed so) leaves no lease or
mapping behind: the next start's unload releases the file again; SIGTERM's path releases too.
The files a child reads beyond its manifest (split shards, a projector) are leased and released
by the plugin (``werk_llamacpp.modelfiles``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from werk_llamacpp.modelfiles import ExtraFiles, extra_files, release_wanted
from werk_llamacpp.testing.hosts import profile_host
from werk_llamacpp.testing.testmodel import generate_model

from werk_host.plugin import ModelManifest
from werk_host.plugin.filecache import ModelFiles
from werk_host.plugin.pages import resident_bytes
from werk_host.testing.api import Api
from werk_host.testing.host import ModelRegistry
from werk_host.testing.hosts import running, serve_process

pytestmark = pytest.mark.llamaserver
KEY, OPERATOR = "sk-werk-cache-0123", "sk-werk-cache-op-0123"


def _profile(release: str) -> str:
    return f'[[instance]]\nid = "tiny"\nmodel = "tiny"\nkeep_alive = "10m"\nmodel_cache_release = "{release}"\n'


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~20 MB generated GGUF, written through to disk so its cached pages are clean."""
    path = generate_model(tmp_path_factory.mktemp("cache") / "tiny.gguf", dim=256, layers=4)
    _fsync(path)
    return path


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated MoE GGUF (8 experts in each of 4 layers), written through to disk."""
    path = generate_model(tmp_path_factory.mktemp("moe") / "moe.gguf", dim=256, layers=4, ffn=512, experts=8)
    _fsync(path)
    return path


def _home(tmp_path: Path, model: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    ModelRegistry(home).add(ModelManifest.from_paths("tiny", [model], backend="llama.cpp"))
    return home


@pytest.fixture
def served(tmp_path: Path, model: Path, llama_server_path: Path) -> Iterator[Any]:
    def serve(release: str, gguf: Path = model) -> Api:
        host = profile_host(
            tmp_path / "home", {"tiny": gguf}, _profile(release), llama_server_path,
            api_keys=(KEY,), operator_api_keys=(OPERATOR,),
        )  # fmt: skip
        url = stack.enter_context(running(host))
        return Api(url, OPERATOR)

    with contextlib.ExitStack() as stack:
        yield serve


def _chat(api: Api) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    status, doc = api.post("/v1/chat/completions", body)
    assert status == 200, doc


def _cached(model: Path) -> int:
    """Read the whole file (into the page cache) and return its resident bytes."""
    with open(model, "rb") as f:
        while f.read(1 << 20):
            pass
    return resident_bytes(model)


def _unload(api: Api) -> dict[str, Any]:
    status, doc = api.post("/werk/v1/deployments/tiny/actions", {"action": "unload"})
    assert status == 200, doc
    status, doc = api.get("/werk/v1/deployments")
    assert status == 200, doc
    inventory: dict[str, Any] = doc["data"]["inventory"][0]
    assert inventory["state"] == "cold"
    return inventory


def _log(api: Api) -> str:
    status, doc = api.get("/werk/v1/deployments/tiny/logs")
    assert status == 200, doc
    return "\n".join(doc["data"]["lines"])


def _leased_by_someone(model: Path) -> bool:
    fd = os.open(model, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _mapped_anywhere(model: Path) -> list[int]:
    ino = os.stat(model).st_ino
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            maps = (entry / "maps").read_text()
        except OSError:
            continue
        if any(line.split()[4:5] == [str(ino)] and str(model) in line for line in maps.splitlines()):
            pids.append(int(entry.name))
    return pids


@pytest.mark.parametrize("which", ["generated", "smollm2"])
def test_release_on_drops_the_pages_after_the_child_is_gone(
    served: Any, model: Path, which: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if which == "smollm2":  # a copy: other tests' children may map the cached file meanwhile
        model = tmp_path / "SmolLM2-135M-Instruct.gguf"
        shutil.copyfile(request.getfixturevalue("smollm2_gguf"), model)
        _fsync(model)
    api = served("on", model)
    _chat(api)
    status, doc = api.get("/werk/v1/deployments")
    cache = doc["data"]["inventory"][0]["file_cache"]
    assert cache["mode"] == "on" and cache["release"] is True and cache["leased_files"] == 1, cache
    assert _leased_by_someone(model)  # Werk's shared lease while the instance lives
    size = model.stat().st_size
    assert _cached(model) >= 0.9 * size
    inventory = _unload(api)
    assert resident_bytes(model) <= 0.05 * size
    assert inventory["file_cache"]["leased_files"] == 0
    assert inventory["file_cache"]["last_release"] == [
        {"file": model.name, "bytes": size, "released": True, "why": None}
    ]
    assert "file cache released for 1 file(s)" in _log(api)
    assert not _leased_by_someone(model) and not _mapped_anywhere(model)


def test_prepared_expert_pages_are_unmapped_before_the_release(
    served: Any, moe: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WERK_LLAMA_ARGS", "--cpu-moe")
    monkeypatch.setenv("WERK_LLAMA_PREFETCH", "auto")
    api = served("on", moe)
    _chat(api)
    assert os.getpid() in _mapped_anywhere(moe)  # the preparation's mappings, kept for the child's life
    size = moe.stat().st_size
    assert _cached(moe) >= 0.9 * size
    inventory = _unload(api)
    assert inventory["file_cache"]["last_release"][0]["released"] is True, inventory
    assert not _mapped_anywhere(moe) and not _leased_by_someone(moe)
    assert resident_bytes(moe) <= 0.05 * size


def test_release_off_keeps_the_pages(served: Any, model: Path) -> None:
    api = served("off")
    _chat(api)
    size = model.stat().st_size
    assert _cached(model) >= 0.9 * size
    inventory = _unload(api)
    assert resident_bytes(model) >= 0.9 * size
    assert inventory["file_cache"]["release"] is False
    assert inventory["file_cache"]["last_release"][0]["why"] == "release is off"
    assert "file cache kept (release is off)" in _log(api)


def test_another_werk_readers_lease_keeps_the_pages(served: Any, model: Path) -> None:
    api = served("on")
    _chat(api)
    other = ModelFiles.lease([model])  # a second Werk reader of the same file
    try:
        assert other.leased == 1
        size = model.stat().st_size
        assert _cached(model) >= 0.9 * size
        inventory = _unload(api)
        assert resident_bytes(model) >= 0.9 * size
        assert inventory["file_cache"]["last_release"][0] == {
            "file": model.name,
            "bytes": size,
            "released": False,
            "why": "another Werk reader holds a lease",
        }
    finally:
        other.release(advise=False)


def _werk_pid(log: Path) -> int:
    """The ``werk serve`` process: the one whose stderr is ``log``."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "fd" / "2") == str(log):
                    return int(entry.name)
            except OSError:
                continue
    raise AssertionError("werk serve not found")


def _wait(what: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_sigkill_leaves_no_lease_or_mapping_behind_and_sigterm_releases(
    tmp_path: Path, model: Path, llama_server_path: Path
) -> None:
    home = _home(tmp_path, model)
    args = ("--model", "tiny", "--model-cache-release", "on", "--backend-option")
    args += (f"llamacpp.llama_server={llama_server_path}",)
    env = {"WERK_OPERATOR_API_KEYS": OPERATOR}
    with serve_process(home, *args, keys=(KEY,), env=env) as first:
        api = Api(first.url, OPERATOR)
        _chat(api)
        status, doc = api.get("/werk/v1/deployments")
        child = doc["data"]["inventory"][0]["pid"]
        assert child is not None and _leased_by_someone(model)
        os.kill(_werk_pid(first.log), signal.SIGKILL)
        _wait(lambda: not Path(f"/proc/{child}").exists() or _zombie(child))
        _wait(lambda: not _leased_by_someone(model) and not _mapped_anywhere(model))
    with serve_process(home, *args, keys=(KEY,), env=env) as second:
        api = Api(second.url, OPERATOR)
        _chat(api)
        status, doc = api.get("/werk/v1/deployments")
        child = doc["data"]["inventory"][0]["pid"]
        os.kill(child, signal.SIGKILL)  # the child dies under a live instance
        _wait(lambda: not Path(f"/proc/{child}").exists() or _zombie(child))
        size = model.stat().st_size
        assert _cached(model) >= 0.9 * size
        inventory = _unload(api)
        assert inventory["file_cache"]["last_release"][0]["released"] is True, inventory
        assert resident_bytes(model) <= 0.05 * size
    with serve_process(home, *args, keys=(KEY,), env=env) as third:
        _chat(Api(third.url, OPERATOR))
        assert _cached(model) >= 0.9 * size
    # the block ended with SIGTERM: the signal path closes the instance, then releases
    assert resident_bytes(model) <= 0.05 * size
    assert "file cache released for 1 file(s)" in third.log.read_text()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return True


def _clean_file(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())
    path.read_bytes()
    return path


def test_the_shards_and_projector_beyond_the_manifest_are_leased_and_released(tmp_path: Path) -> None:
    size = 4 << 20
    first, second, projector = (
        _clean_file(tmp_path / name, size) for name in ("m-00001-of-00002.gguf", "m-00002-of-00002.gguf", "mmproj.gguf")
    )
    argv = ["-m", str(first), "--mmproj", str(projector), "-c", "512"]
    assert extra_files(argv, first) == [second, projector]
    assert extra_files([f"--mmproj={tmp_path / 'absent.gguf'}"], first) == [second]
    assert release_wanted("on") and not release_wanted("off") and not release_wanted("bogus")
    kept = ExtraFiles(argv, first, release=False)
    assert _leased_by_someone(second) and _leased_by_someone(projector)
    kept.close()
    assert not _leased_by_someone(second) and resident_bytes(second) >= 0.9 * size
    released = ExtraFiles(argv, first, release=True)
    released.close()
    released.close()  # idempotent
    assert resident_bytes(second) <= 0.05 * size and resident_bytes(projector) <= 0.05 * size
    assert resident_bytes(first) >= 0.9 * size  # the manifest's own file is the host's to release
