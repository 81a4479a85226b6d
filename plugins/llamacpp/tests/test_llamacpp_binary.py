from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from llamacpp_fakes import FAKE_HELP, calls, write_fake_server
from werk_llamacpp import binary
from werk_llamacpp.binary import (
    BUILD_CACHE_VERSION,
    ExecutableIdentity,
    LlamaServerNotFound,
    UnadvertisedFlagError,
    find_llama_server,
    flags_in_args,
    inspect_executable,
    parse_help_flags,
    sha256_file,
)


def test_parse_help_flags() -> None:
    flags = parse_help_flags(FAKE_HELP)
    assert flags == {
        "-h",
        "--help",
        "--usage",
        "--version",
        "-t",
        "--threads",
        "-c",
        "--ctx-size",
        "-m",
        "--model",
        "--warmup",
        "--no-warmup",
        "-np",
        "--parallel",
        "--host",
        "--port",
        "--slot-save-path",
        "--api-key",
    }
    assert "--not-a-real-flag" not in flags  # mentioned in a description only


def test_flags_in_args() -> None:
    args = ["--host", "127.0.0.1", "-np", "2", "--port=8080", "-ngl", "-1", "--", "-", "--x.y"]
    assert flags_in_args(args) == ["--host", "-np", "--port", "-ngl", "--x.y"]


def test_sha256_and_identity(tmp_path: Path) -> None:
    f = tmp_path / "blob"
    f.write_bytes(os.urandom(3 << 20))
    assert sha256_file(f, chunk_size=4096) == hashlib.sha256(f.read_bytes()).hexdigest()
    ident = ExecutableIdentity.of(f)
    assert ident.size == 3 << 20 and ident.still_matches()
    f.write_bytes(b"changed")
    assert not ident.still_matches()


def test_discovery_order(tmp_path: Path) -> None:
    explicit = write_fake_server(tmp_path / "explicit")
    from_env = write_fake_server(tmp_path / "env")
    on_path = write_fake_server(tmp_path / "path")
    cache = tmp_path / "cache"
    cached = write_fake_server(cache / "werk" / "llama-server" / BUILD_CACHE_VERSION)
    env = {"WERK_LLAMA_SERVER": str(from_env), "PATH": str(on_path.parent), "XDG_CACHE_HOME": str(cache)}
    assert find_llama_server(explicit, env=env) == explicit
    assert find_llama_server(None, env=env) == from_env
    env.pop("WERK_LLAMA_SERVER")
    assert find_llama_server(None, env=env) == on_path
    env["PATH"] = str(tmp_path / "empty")
    assert find_llama_server(None, env=env) == cached
    with pytest.raises(LlamaServerNotFound):
        find_llama_server(None, env=env, use_build_cache=False)


def test_other_cached_versions_are_a_fallback(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    other = write_fake_server(cache / "werk" / "llama-server" / "1.0.0")
    env = {"PATH": "", "XDG_CACHE_HOME": str(cache)}
    assert find_llama_server(None, env=env) == other


def test_unusable_explicit_or_env_is_an_error_not_a_fallthrough(tmp_path: Path) -> None:
    on_path = write_fake_server(tmp_path / "path")
    env = {"PATH": str(on_path.parent)}
    with pytest.raises(LlamaServerNotFound):
        find_llama_server(tmp_path / "missing", env=env)
    not_exec = tmp_path / "not-exec"
    not_exec.write_text("x")
    with pytest.raises(LlamaServerNotFound):
        find_llama_server(None, env={**env, "WERK_LLAMA_SERVER": str(not_exec)})


def test_help_is_inspected_once_per_identity(tmp_path: Path) -> None:
    binary.clear_inspection_cache()
    fake = write_fake_server(tmp_path)
    a = inspect_executable(fake)
    b = inspect_executable(fake)
    assert a is b
    assert calls(fake) == ["--help", "--version"]
    assert a.help_sha256 == hashlib.sha256(FAKE_HELP.encode()).hexdigest()
    assert a.sha256 == sha256_file(fake)
    assert a.version_text == "version: 1 (fake)"
    assert a.advertises("--slot-save-path") and not a.advertises("--metrics")
    a.verify_flags(["--host", "127.0.0.1", "-np", "2", "--no-warmup"])
    with pytest.raises(UnadvertisedFlagError) as err:
        a.verify_flags(["--host", "h", "--metrics", "--kv-unified", "--metrics"])
    assert err.value.flags == ("--metrics", "--kv-unified")
    # a changed executable is a new identity and is inspected again
    fake.write_text(fake.read_text() + "\n# changed\n")
    c = inspect_executable(fake)
    assert c is not a and c.sha256 != a.sha256
    assert calls(fake) == ["--help", "--version", "--help", "--version"]


@pytest.fixture
def hashed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The executables hashed from now on, with nothing inspected in memory and a user cache of
    the test's own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    binary.clear_inspection_cache()
    seen: list[Path] = []

    def counting(path: str | os.PathLike[str]) -> str:
        seen.append(Path(path))
        return sha256_file(path)

    monkeypatch.setattr(binary, "sha256_file", counting)
    return seen


def test_a_repeated_inspection_of_an_unchanged_executable_is_not_hashed_again(
    tmp_path: Path, hashed: list[Path]
) -> None:
    """Each start asks for the inspection several times (its arguments, then the spawn): the
    executable is hashed once while it is unchanged, and again once its status changes
    (docs/operations.md, "Start-up")."""
    fake = write_fake_server(tmp_path)
    first = inspect_executable(fake)
    assert all(inspect_executable(fake) is first for _ in range(4))
    assert len(hashed) == 1
    fake.write_text(fake.read_text() + "\n# changed\n")
    changed = inspect_executable(fake)
    assert changed is not first and changed.sha256 == sha256_file(fake)
    assert len(hashed) == 2
    assert calls(fake) == ["--help", "--version", "--help", "--version"]


def test_an_inspection_is_remembered_for_later_processes_while_the_file_is_unchanged(
    tmp_path: Path, hashed: list[Path]
) -> None:
    """A later start (a new process: nothing in memory) of the unchanged executable neither runs
    it nor hashes it: its inspection is remembered under the user cache by the file's status
    (docs/operations.md, "Start-up"). A changed file is inspected again."""
    fake = write_fake_server(tmp_path)
    first = inspect_executable(fake)
    binary.clear_inspection_cache()  # as in a new process
    again = inspect_executable(fake)
    assert again is not first and again == first
    assert len(hashed) == 1 and calls(fake) == ["--help", "--version"]
    fake.write_text(fake.read_text() + "\n# changed\n")
    binary.clear_inspection_cache()
    changed = inspect_executable(fake)
    assert changed.sha256 == sha256_file(fake) != first.sha256
    assert len(hashed) == 2 and calls(fake) == ["--help", "--version", "--help", "--version"]


def test_inspection_fails_for_non_llama_executable(tmp_path: Path) -> None:
    exe = tmp_path / "true-ish"
    exe.write_text("#!/bin/sh\necho 'nothing here'\n")
    exe.chmod(0o755)
    with pytest.raises(binary.InspectionError):
        inspect_executable(exe)


@pytest.mark.llamaserver
def test_real_binary_help(llama_server_path: Path) -> None:
    info = inspect_executable(llama_server_path)
    for flag in (
        "--host",
        "--port",
        "-m",
        "--model",
        "-np",
        "--parallel",
        "-c",
        "--ctx-size",
        "--slot-save-path",
        "--no-warmup",
        "--warmup",
        "-t",
        "--threads",
    ):
        assert info.advertises(flag), flag
    assert len(info.flags) > 100
    assert len(info.sha256) == 64 and len(info.help_sha256) == 64
    assert "version" in info.version_text
    with pytest.raises(UnadvertisedFlagError):
        info.verify_flags(["--definitely-not-a-llama-flag"])


def test_an_executable_check_that_cannot_finish_turns_persistence_off_instead_of_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slot saves and restores wait for the check after readiness: one that ends early, however
    it ends, answers with persistence off, never with a wait that does not end."""
    fake = write_fake_server(tmp_path)
    expected = binary.ExecutableIdentity.of(fake)
    assert binary.ExecutableCheck(expected).failure() is None  # unchanged: persistence stays on

    def broken(path: str | os.PathLike[str]) -> binary.ExecutableIdentity:
        raise RuntimeError("a bug in the check")

    monkeypatch.setattr(binary.ExecutableIdentity, "of", broken)
    reason = binary.ExecutableCheck(expected).failure()
    assert reason is not None and "native persistence is off" in reason
