"""werk-qwen-tts' plugin module: the entry point ``werk: qwen-tts`` names it.

It offers the collected hooks only, the adapter factory and the doctor checks; every operation
is a method of :class:`werk_qwen_tts.adapter.QwenTtsAdapter` (docs/plugin-hooks.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import JsonValue

from werk_host.plugin import AdapterFactory, DoctorCheck, HostConfig, hookimpl
from werk_host.plugin.engines import engine_doctor_checks

from .adapter import BACKEND_ID, REPORTED, accepts, create_adapter
from .settings import CACHE_SIZE_ENV, PYTHON_ENV, cache_size, parse_options

__all__ = ["PLUGIN_NAME", "werk_adapter_factories", "werk_doctor_checks"]

PLUGIN_NAME = BACKEND_ID
#: What ``werk doctor`` asks the engine interpreter: the installed versions (metadata only: the
#: worker's own import of qwen_tts needs its torchaudio stand-in, worker.py).
PROBE = (
    "import importlib.metadata as m, sys\n"
    "print(' '.join(f'{d} {m.version(d)}' for d in ('torch', 'qwen-tts', 'transformers', 'soundfile')))"
)


def _validate_options(options: Mapping[str, JsonValue]) -> None:
    """A profile instance's options, checked when ``werk serve`` starts (docs/plugin-kit.md,
    "Options"); raises :class:`ValueError` naming the option."""
    parse_options(options)


@hookimpl
def werk_adapter_factories(config: HostConfig) -> list[AdapterFactory]:
    return [
        AdapterFactory(
            BACKEND_ID,
            accepts,
            create_adapter,
            "Qwen3-TTS speech (qwen-tts on torch) in one Werk-owned resident worker with a model LRU",
            REPORTED,
            validate_options=_validate_options,
        )
    ]


@hookimpl
def werk_doctor_checks(config: HostConfig) -> list[DoctorCheck]:
    return engine_doctor_checks(
        config,
        BACKEND_ID,
        parse=parse_options,
        cache_size=cache_size,
        cache_size_env=CACHE_SIZE_ENV,
        python_env=PYTHON_ENV,
        probe=PROBE,
        missing="torch, qwen-tts, transformers or soundfile is not installed there",
    )
