"""Model manifests: named, checksum-sensitive descriptions of installed model files.

A manifest lives at ``WERK_HOME/models/<name>.json`` and records each file's absolute
path, size and SHA-256, the backend id (optional) and free-form parameters such as
``max_output_tokens``. Its ``identity`` is a SHA-256 over that content, so replacing a
file under the same name yields a different identity.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from werk_host.digests import remembered_sha256
from werk_host.errors import ErrorCode, WerkError
from werk_host.paths import ensure_private_dir

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class ModelFile:
    path: str
    bytes: int
    sha256: str


#: Manifest params that cap a request's output tokens (docs/protocol.md, "Chat planning").
OUTPUT_CEILING_PARAMS = ("max_output_tokens", "max_completion_tokens", "max_new_tokens")


@dataclass(frozen=True)
class ModelManifest:
    name: str
    files: tuple[ModelFile, ...]
    backend: str | None = None
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def primary_path(self) -> Path:
        return Path(self.files[0].path)

    @cached_property
    def identity(self) -> str:
        """SHA-256 of the canonical manifest (computed once: the manifest is immutable)."""
        canonical = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "backend": self.backend,
            "files": [{"path": f.path, "bytes": f.bytes, "sha256": f.sha256} for f in self.files],
            "params": self.params,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelManifest:
        files = tuple(ModelFile(str(f["path"]), int(f["bytes"]), str(f["sha256"])) for f in raw["files"])
        if not files:
            raise ValueError("a manifest needs at least one file")
        return cls(str(raw["name"]), files, raw.get("backend"), dict(raw.get("params") or {}))

    @classmethod
    def from_paths(
        cls, name: str, paths: list[Path], *, backend: str | None = None, params: dict[str, Any] | None = None
    ) -> ModelManifest:
        if not NAME_RE.match(name):
            raise WerkError(ErrorCode.INVALID_REQUEST, "model names use letters, digits, '.', '_' and '-'")
        files = []
        for path in paths:
            resolved = path.expanduser().resolve()
            if not resolved.is_file():
                raise WerkError(ErrorCode.NOT_FOUND, f"model file not found: {path.name}")
            files.append(ModelFile(str(resolved), resolved.stat().st_size, remembered_sha256(resolved)))
        return cls(name, tuple(files), backend, dict(params or {}))

    def output_ceiling(self) -> int | None:
        """The smallest explicit output ceiling among the manifest's params
        (:data:`OUTPUT_CEILING_PARAMS`, each a positive integer or ``{"max": N}``); ``None``
        when there is none. Generation defaults are not ceilings."""
        found: list[int] = []
        for name in OUTPUT_CEILING_PARAMS:
            value = self.params.get(name)
            if isinstance(value, dict):
                value = value.get("max")
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                found.append(value)
        return min(found) if found else None

    def verify_files(self) -> bool:
        """Whether every file still has its recorded size (cheap check; hashes are not recomputed)."""
        try:
            return all(Path(f.path).stat().st_size == f.bytes for f in self.files)
        except OSError:
            return False


#: The file that makes a directory a Diffusers pipeline folder (docs/diffusers.md).
DIFFUSERS_INDEX = "model_index.json"
#: The file that makes a directory a Qwen3-TTS folder, its codec in a subfolder (docs/media.md).
SPEECH_TOKENIZER_CONFIG = "speech_tokenizer/config.json"
#: Files whose presence makes a model span its directory's subfolders.
NESTED_MODEL_MARKERS = (DIFFUSERS_INDEX, SPEECH_TOKENIZER_CONFIG)


def model_dir_files(directory: Path) -> list[Path]:
    """The files a model directory's manifest lists (``werk models add DIR``, the kit's
    ``checkpoint_manifest``): the regular, non-hidden files directly in it, sorted; for a folder
    whose model spans subfolders (one holding a file of :data:`NESTED_MODEL_MARKERS`: a
    Diffusers pipeline, a Qwen3-TTS model with its speech tokenizer) every regular file under it,
    recursively, none under a hidden name, sorted by relative path."""
    if not any((directory / marker).is_file() for marker in NESTED_MODEL_MARKERS):
        return sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith("."))
    found = [p for p in directory.rglob("*") if p.is_file()]
    visible = [p for p in found if not any(part.startswith(".") for part in p.relative_to(directory).parts)]
    return sorted(visible, key=lambda p: p.relative_to(directory).parts)


def parse_param(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE parsed as JSON when it is valid JSON, else kept as text."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


class ModelRegistry:
    """Manifests under ``WERK_HOME/models``."""

    def __init__(self, home: Path) -> None:
        self.dir = home / "models"

    def _path(self, name: str) -> Path:
        if not NAME_RE.match(name):
            raise WerkError(ErrorCode.INVALID_REQUEST, "invalid model name")
        return self.dir / f"{name}.json"

    def add(self, manifest: ModelManifest) -> Path:
        ensure_private_dir(self.dir)
        target = self._path(manifest.name)
        tmp = target.with_suffix(".json.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(manifest.as_dict(), handle, indent=2, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
        return target

    def get(self, name: str) -> ModelManifest | None:
        path = self._path(name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as err:
            raise WerkError(ErrorCode.FORBIDDEN, "model manifest is not a regular file") from err
        with os.fdopen(fd) as handle:
            return ModelManifest.from_dict(json.load(handle))

    def list(self) -> list[ModelManifest]:
        if not self.dir.is_dir():
            return []
        found = []
        for path in sorted(self.dir.glob("*.json")):
            manifest = self.get(path.stem)
            if manifest is not None:
                found.append(manifest)
        return found

    def remove(self, name: str) -> bool:
        path = self._path(name)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True

    def resolve(self, name_or_path: str) -> ModelManifest:
        """A registered manifest by name, or an ad-hoc manifest for an existing file path."""
        if NAME_RE.match(name_or_path):
            manifest = self.get(name_or_path)
            if manifest is not None:
                return manifest
        path = Path(name_or_path).expanduser()
        if path.is_file():
            stem = re.sub(r"[^A-Za-z0-9._-]", "-", path.stem)[:128] or "model"
            return ModelManifest.from_paths(stem, [path])
        raise WerkError(ErrorCode.NOT_FOUND, f"unknown model {name_or_path!r}")
