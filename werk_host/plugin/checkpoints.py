"""Hugging Face checkpoint directories, and how a model on disk becomes a manifest
(docs/plugin-kit.md, "Models and manifests").

A *checkpoint directory* is one directory holding ``config.json`` and at least one
``*.safetensors`` file side by side (tokenizer files, chat templates and the like may lie
beside them). The rules every backend that serves such checkpoints shares:

* :func:`checkpoint_manifest` turns a path into a :class:`~werk_host.plugin.ModelManifest`: a
  checkpoint directory becomes a manifest of every regular, non-hidden file directly in it
  (sorted; path, size and SHA-256 each, exactly the files ``werk models add DIR`` registers),
  with the detected architecture in ``params["architecture"]``; a *Diffusers folder* (one
  holding ``model_index.json``, its components in subfolders: ``unet/``, ``vae/``, ...) becomes
  a manifest of every regular file under it, recursively, none under a hidden name (sorted by
  relative path; :func:`diffusers_files`, again what ``werk models add DIR`` registers), with
  the pipeline's ``_class_name`` in ``params["architecture"]``; a model file (a GGUF, say)
  becomes a one-file manifest. The name defaults to the directory's (or file's stem), made a
  valid model name. The conformance suite builds ``ConformanceTarget(model=<path>)`` this way.
* :func:`checkpoint_dir` says whether a manifest *is* such a checkpoint directory (all its files
  in one directory, with ``config.json`` and a ``*.safetensors`` among them, and no
  ``model_index.json``), for an adapter factory's ``accepts``; :func:`diffusers_dir` whether it
  is a Diffusers folder (a ``model_index.json`` and every other file under its directory), and
  :func:`is_diffusers_dir` whether a directory on disk is one.
* :func:`read_config`, :func:`architecture`, :func:`context_length` read ``config.json``;
  :func:`safetensors_metadata` reads the ``__metadata__`` of the first ``*.safetensors`` file's
  header (for instance ``{"format": "mlx"}`` marks an MLX conversion). None of them loads
  weights or follows anything outside the directory, and each answers ``None`` for what is
  absent or malformed instead of raising.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from werk_host.errors import ErrorCode, WerkError
from werk_host.models import DIFFUSERS_INDEX, NAME_RE, ModelManifest, model_dir_files

__all__ = [
    "CONFIG_NAME",
    "DIFFUSERS_INDEX",
    "WEIGHTS_SUFFIX",
    "architecture",
    "checkpoint_dir",
    "checkpoint_files",
    "checkpoint_manifest",
    "context_length",
    "diffusers_dir",
    "diffusers_files",
    "is_checkpoint_dir",
    "is_diffusers_dir",
    "model_root",
    "read_config",
    "safetensors_metadata",
]

CONFIG_NAME = "config.json"
#: The file that makes a directory a Diffusers folder.
WEIGHTS_SUFFIX = ".safetensors"
#: A ``config.json`` (or a safetensors header) larger than this is not read.
MAX_CONFIG_BYTES = 16 << 20
MAX_HEADER_BYTES = 100 << 20


def checkpoint_files(directory: Path) -> list[Path]:
    """The regular, non-hidden files directly in ``directory``, sorted (what a manifest lists)."""
    return sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith("."))


def diffusers_files(directory: Path) -> list[Path]:
    """Every regular file under the Diffusers folder ``directory``, recursively, none under a
    hidden name, sorted by relative path: what its manifest lists, and exactly what ``werk
    models add DIR`` registers (both are :func:`werk_host.models.model_dir_files`)."""
    return model_dir_files(directory)


def is_diffusers_dir(directory: Path) -> bool:
    """Whether ``directory`` holds ``model_index.json`` (a Diffusers folder)."""
    try:
        return (directory / DIFFUSERS_INDEX).is_file()
    except OSError:
        return False


def diffusers_dir(manifest: ModelManifest | None) -> Path | None:
    """The folder of ``manifest`` when it is one Diffusers folder (a ``model_index.json`` and
    every other file under its directory), judged by its recorded files alone; else ``None``."""
    return model_root(manifest, DIFFUSERS_INDEX)


def model_root(manifest: ModelManifest | None, marker: str) -> Path | None:
    """The folder of ``manifest`` when its recorded files are one folder holding ``marker`` (a
    path relative to it, e.g. ``model_index.json`` or ``speech_tokenizer/config.json``) and
    every other file under it, judged by the recorded files alone; else ``None``."""
    if manifest is None or not manifest.files:
        return None
    paths = [Path(f.path) for f in manifest.files]
    depth = len(Path(marker).parts)
    roots = [p.parents[depth - 1] for p in paths if p.parts[-depth:] == Path(marker).parts]
    if len(roots) != 1:
        return None
    root = roots[0]
    if not all(p.is_relative_to(root) for p in paths):
        return None
    return root


def is_checkpoint_dir(directory: Path) -> bool:
    """Whether ``directory`` holds ``config.json`` and a ``*.safetensors`` file side by side."""
    try:
        names = {p.name for p in checkpoint_files(directory)}
    except OSError:
        return False
    return CONFIG_NAME in names and any(n.endswith(WEIGHTS_SUFFIX) for n in names)


def checkpoint_dir(manifest: ModelManifest | None) -> Path | None:
    """The directory of ``manifest`` when it is one checkpoint directory (module docstring),
    judged by its recorded files alone (nothing is read); else ``None``."""
    if manifest is None or not manifest.files:
        return None
    paths = [Path(f.path) for f in manifest.files]
    parents = {p.parent for p in paths}
    names = {p.name for p in paths}
    if len(parents) != 1 or CONFIG_NAME not in names or not any(n.endswith(WEIGHTS_SUFFIX) for n in names):
        return None
    if DIFFUSERS_INDEX in names:
        return None  # a Diffusers pipeline's top level, not a transformers checkpoint
    return next(iter(parents))


def _small_json(path: Path, limit: int) -> Any:
    try:
        with path.open("rb") as source:
            raw = source.read(limit + 1)
    except OSError:
        return None
    if len(raw) > limit:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def read_config(directory: Path) -> dict[str, Any] | None:
    """``config.json`` of ``directory`` as an object (``None``: absent, oversized or not an object)."""
    config = _small_json(directory / CONFIG_NAME, MAX_CONFIG_BYTES)
    return config if isinstance(config, dict) else None


def architecture(directory: Path) -> str | None:
    """The model's architecture: the first of ``config.json``'s ``architectures``
    (``"LlamaForCausalLM"``), else its ``model_type`` (``"llama"``); ``None`` when neither is there."""
    config = read_config(directory)
    if config is None:
        return None
    named = config.get("architectures")
    if isinstance(named, list) and named and isinstance(named[0], str) and named[0]:
        return named[0]
    kind = config.get("model_type")
    return kind if isinstance(kind, str) and kind else None


def context_length(directory: Path) -> int | None:
    """``max_position_embeddings`` of ``config.json`` (``None`` when absent or not a positive int)."""
    config = read_config(directory)
    value = config.get("max_position_embeddings") if config is not None else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def safetensors_metadata(directory: Path) -> dict[str, str] | None:
    """The ``__metadata__`` of the first (by name) ``*.safetensors`` file's header; ``None`` when
    there is no such file, its header is malformed or larger than 100 MiB, or it has none."""
    weights = sorted(p for p in directory.glob(f"*{WEIGHTS_SUFFIX}") if p.is_file())
    if not weights:
        return None
    try:
        with weights[0].open("rb") as source:
            length = int.from_bytes(source.read(8), "little")
            if not 0 < length <= MAX_HEADER_BYTES:
                return None
            header = json.loads(source.read(length))
    except (OSError, ValueError):
        return None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict):
        return None
    return {str(k): str(v) for k, v in meta.items()}


def _model_name(stem: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]", "-", stem).lstrip("._-")[:128]
    return name if NAME_RE.match(name) else "model"


def checkpoint_manifest(
    path: str | Path, name: str | None = None, *, backend: str | None = None, params: dict[str, Any] | None = None
) -> ModelManifest:
    """The manifest of a checkpoint directory or a model file (module docstring).

    ``backend`` pins the manifest to a backend id; ``params`` are added to the detected ones.
    Raises :class:`~werk_host.plugin.WerkError`: ``not_found`` when ``path`` does not exist,
    ``invalid_request`` for a directory that is not a checkpoint directory or an invalid name.
    """
    target = Path(path).expanduser().resolve()
    if target.is_file():
        return ModelManifest.from_paths(name or _model_name(target.stem), [target], backend=backend, params=params)
    if not target.is_dir():
        raise WerkError(ErrorCode.NOT_FOUND, f"model path not found: {target.name}")
    if is_diffusers_dir(target):
        index = _small_json(target / DIFFUSERS_INDEX, MAX_CONFIG_BYTES)
        kind = index.get("_class_name") if isinstance(index, dict) else None
        found_kind: dict[str, Any] = {"architecture": kind} if isinstance(kind, str) and kind else {}
        return ModelManifest.from_paths(
            name or _model_name(target.name),
            diffusers_files(target),
            backend=backend,
            params={**found_kind, **(params or {})},
        )
    if not is_checkpoint_dir(target):
        raise WerkError(
            ErrorCode.INVALID_REQUEST,
            f"{target.name} is not a checkpoint directory: it needs {CONFIG_NAME} and a *{WEIGHTS_SUFFIX} file",
        )
    detected: dict[str, Any] = {}
    found = architecture(target)
    if found is not None:
        detected["architecture"] = found
    return ModelManifest.from_paths(
        name or _model_name(target.name),
        model_dir_files(target),  # its files, and a nested model's subfolders (werk_host.models)
        backend=backend,
        params={**detected, **(params or {})},
    )
