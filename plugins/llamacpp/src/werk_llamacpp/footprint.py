"""What a llama.cpp instance will need beyond its GGUF file, before it starts: the factory's
``memory_estimate`` (docs/deployments.md, "Memory estimate"; docs/plugin-hooks.md).

The launch arguments are the ones :class:`~werk_llamacpp.core.LlamaServerCore` gives the child
(``-np`` the ``parallel`` option, ``-c`` the ``ctx`` option or the default context of
:func:`.gguf_meta.default_context`), then ``WERK_LLAMA_ARGS``, whose last flags win as on the
child's command line. From them and the GGUF header: the KV cache of the whole context
(:func:`.gguf_meta.kv_cache_bytes`, honouring ``--cache-type-k``/``--cache-type-v``,
``--swa-full``, ``--kv-unified`` and ``--ubatch-size``), and the share of the model's layers
``--n-gpu-layers`` puts on an accelerator (the model's blocks and its output layer: ``-ngl``
of ``layers + 1``; ``all``, ``auto`` or a negative count: all of them), as the instance's
deployment plan reports it.
"""

from __future__ import annotations

import os
import shlex
import struct

from werk_host.plugin import HostConfig, MemoryEstimate, ModelManifest

from .core import PLUGIN_NAME, _available_memory
from .gguf_meta import GgufError, default_context, kv_cache_bytes, kv_shape, read_metadata, trained_context
from .process import ENV_ARGS, last_flag_value

_GPU_LAYER_FLAGS = ("-ngl", "--gpu-layers", "--n-gpu-layers")
#: llama-server's default micro-batch (``--ubatch-size``)
_UBATCH = 512


def memory_estimate(config: HostConfig, manifest: ModelManifest) -> MemoryEstimate | None:
    """The KV cache and accelerator share of an instance of ``manifest`` started with
    ``config``'s options (module docstring); ``None`` when the header cannot be read."""
    options = config.backend_options.get(PLUGIN_NAME, {})
    try:
        meta = read_metadata(manifest.primary_path)
    except (OSError, GgufError, struct.error):
        return None
    shape = kv_shape(meta)
    if shape is None:
        return None
    parallel = int(str(options.get("parallel", 2)))
    if "ctx" in options:
        ctx = int(str(options["ctx"]))
    else:
        ctx = parallel * default_context(manifest.primary_path, parallel, _available_memory())
    argv = ["-np", str(parallel), "-c", str(ctx), *shlex.split(os.environ.get(ENV_ARGS, ""))]
    parallel = _number(last_flag_value(argv, ("-np", "--parallel"))) or 1
    ctx = _number(last_flag_value(argv, ("-c", "--ctx-size"))) or trained_context(meta) or ctx
    kv = kv_cache_bytes(
        shape,
        ctx,
        parallel,
        type_k=(last_flag_value(argv, ("-ctk", "--cache-type-k")) or "f16").lower(),
        type_v=(last_flag_value(argv, ("-ctv", "--cache-type-v")) or "f16").lower(),
        swa_full="--swa-full" in argv,
        unified="--kv-unified" in argv or "-kvu" in argv,
        ubatch=_number(last_flag_value(argv, ("-ub", "--ubatch-size"))) or _UBATCH,
    )
    return MemoryEstimate(kv_bytes=kv, context_tokens=ctx, accelerator_share=_share(argv, shape.layers))


def _number(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() and int(value) > 0 else None


def _share(argv: list[str], layers: int) -> float:
    value = last_flag_value(argv, _GPU_LAYER_FLAGS)
    if value is None:
        return 0.0
    if value in ("all", "auto") or value.startswith("-") and value[1:].isdigit():
        return 1.0
    if not value.isdigit():
        return 0.0
    return min(int(value), layers + 1) / (layers + 1)
