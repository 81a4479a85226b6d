"""Backend options and the ``vllm serve`` argument list Werk generates for a local server.

A local server runs::

    vllm serve MODEL_DIR --host 127.0.0.1 --port PORT --served-model-name NAME
               [--max-model-len N] [--gpu-memory-utilization F] [--max-num-seqs N] [--dtype T]
               [--enable-prefix-caching | --no-enable-prefix-caching]   (werk_vllm.apc)
               [--runner pooling --convert embed --pooler-config {"pooling_type":"MEAN"}]   (pooling)
               [WERK_VLLM_ARGS...]

The ``pooling`` option makes the instance an embedding instance (``mean``, ``cls``, ``last``:
vLLM's pooling runner with that sequence pooling, :data:`POOLING_TYPES`) or a reranking one
(``rank``: ``--runner pooling --convert classify``, a cross-encoder answering ``/rerank``);
without it the server generates text, as vLLM resolves the model (docs/vllm.md, "Embeddings").

``WERK_VLLM_ARGS`` (``shlex``-split) comes last, so it overrides any generated setting (vLLM's
parser keeps the last occurrence); everything Werk reads back (context, concurrency, prefix
caching) is read from this final list. The API key never appears here: the child gets it in
``VLLM_API_KEY``.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pydantic import JsonValue

from werk_host.plugin import ErrorCode, WerkError

from .executable import flag_name

__all__ = [
    "DEFAULT_STARTUP_TIMEOUT_S",
    "ENV_ARGS",
    "HOST",
    "LOCAL_OPTIONS",
    "OPTION_FLAGS",
    "POOLING_TYPES",
    "PORT",
    "RANK",
    "REMOTE_OPTIONS",
    "LaunchSettings",
    "RemoteSettings",
    "display_args",
    "env_args",
    "generated_args",
    "int_flag",
    "last_value",
    "parse_options",
    "pooling_args",
]

ENV_ARGS = "WERK_VLLM_ARGS"
HOST = "127.0.0.1"
#: Stands for the port in a planned argument list (the port is chosen at each start).
PORT = "<port>"
DEFAULT_STARTUP_TIMEOUT_S = 600.0
#: Options that become ``vllm serve`` flags, in the order they are emitted.
OPTION_FLAGS: dict[str, str] = {
    "max_model_len": "--max-model-len",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_num_seqs": "--max-num-seqs",
    "dtype": "--dtype",
}
LOCAL_OPTIONS = ("executable", "startup_timeout", *OPTION_FLAGS, "pooling")
#: ``pooling`` values of an embedding instance and the ``--pooler-config`` pooling type of each.
POOLING_TYPES: dict[str, str] = {"mean": "MEAN", "cls": "CLS", "last": "LAST"}
#: The ``pooling`` value of a reranking (cross-encoder) instance.
RANK = "rank"
REMOTE_OPTIONS = ("endpoint", "api_key_env", "request_timeout")
#: Flags whose values are secrets (every value up to the next flag is hidden in plans).
SECRET_FLAGS = ("--api-key", "--hf-token", "--ssl-keyfile")
_DTYPE = re.compile(r"[a-z0-9_]{1,32}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _invalid(message: str) -> WerkError:
    return WerkError(ErrorCode.INVALID_REQUEST, message)


def _positive_int(name: str, value: JsonValue) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _invalid(f"backend option vllm.{name} must be a positive integer")
    return value


def _positive_float(name: str, value: JsonValue, *, at_most: float | None = None) -> float:
    number: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    if number is None or not math.isfinite(number) or number <= 0 or (at_most is not None and number > at_most):
        bound = f" and at most {at_most:g}" if at_most is not None else ""
        raise _invalid(f"backend option vllm.{name} must be a number above 0{bound}")
    return number


@dataclass(frozen=True)
class LaunchSettings:
    """The options of a local (Werk-started) vLLM server."""

    executable: str | None = None
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT_S
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    max_num_seqs: int | None = None
    dtype: str | None = None
    #: ``mean``/``cls``/``last`` (an embedding instance), ``rank`` (a reranker), ``None`` (chat)
    pooling: str | None = None

    def option_args(self) -> list[str]:
        values: dict[str, object | None] = {
            "max_model_len": self.max_model_len,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "max_num_seqs": self.max_num_seqs,
            "dtype": self.dtype,
        }
        args: list[str] = []
        for name, flag in OPTION_FLAGS.items():
            value = values[name]
            if value is not None:
                args += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
        return args


@dataclass(frozen=True)
class RemoteSettings:
    """A remote vLLM endpoint: where it is and which environment variable holds its key."""

    endpoint: str
    api_key_env: str | None = None
    request_timeout: float = 600.0


def parse_options(options: Mapping[str, JsonValue]) -> LaunchSettings | RemoteSettings:
    """The instance's ``vllm`` backend options as settings; ``invalid_request`` names a bad one.

    With ``endpoint`` the instance is remote and the launch options (which may come from
    server-wide ``--backend-option vllm.KEY=V``) do not apply: nothing is launched, and the
    endpoint's own routes say whether it embeds (``pooling`` is checked, then unused)."""
    unknown = sorted(k for k in options if k not in (*LOCAL_OPTIONS, *REMOTE_OPTIONS))
    if unknown:
        raise _invalid(f"unknown vllm backend option(s): {', '.join(unknown)}")
    pooling = options.get("pooling")
    if pooling is not None and pooling not in (*POOLING_TYPES, RANK):
        raise _invalid(f"backend option vllm.pooling must be one of {', '.join((*POOLING_TYPES, RANK))}")
    endpoint = options.get("endpoint")
    if endpoint is not None:
        if not isinstance(endpoint, str) or not re.fullmatch(r"https?://[^\s/]+(/\S*)?", endpoint):
            raise _invalid("backend option vllm.endpoint must be an http:// or https:// URL")
        key_env = options.get("api_key_env")
        if key_env is not None and (not isinstance(key_env, str) or not _ENV_NAME.fullmatch(key_env)):
            raise _invalid("backend option vllm.api_key_env must name an environment variable")
        timeout = options.get("request_timeout")
        return RemoteSettings(
            endpoint,
            key_env,
            _positive_float("request_timeout", timeout) if timeout is not None else 600.0,
        )
    if options.get("api_key_env") is not None or options.get("request_timeout") is not None:
        raise _invalid("backend options vllm.api_key_env and vllm.request_timeout apply to a remote endpoint only")
    executable = options.get("executable")
    if executable is not None and (not isinstance(executable, str) or not executable):
        raise _invalid("backend option vllm.executable must be a path")
    dtype = options.get("dtype")
    if dtype is not None and (not isinstance(dtype, str) or not _DTYPE.fullmatch(dtype)):
        raise _invalid("backend option vllm.dtype must be a vLLM dtype name such as auto, bfloat16 or float32")
    raw = {k: options.get(k) for k in ("startup_timeout", "max_model_len", "gpu_memory_utilization", "max_num_seqs")}
    return LaunchSettings(
        executable=executable,
        startup_timeout=_positive_float("startup_timeout", raw["startup_timeout"])
        if raw["startup_timeout"] is not None
        else DEFAULT_STARTUP_TIMEOUT_S,
        max_model_len=_positive_int("max_model_len", raw["max_model_len"])
        if raw["max_model_len"] is not None
        else None,
        gpu_memory_utilization=_positive_float("gpu_memory_utilization", raw["gpu_memory_utilization"], at_most=1.0)
        if raw["gpu_memory_utilization"] is not None
        else None,
        max_num_seqs=_positive_int("max_num_seqs", raw["max_num_seqs"]) if raw["max_num_seqs"] is not None else None,
        dtype=dtype,
        pooling=pooling if isinstance(pooling, str) else None,
    )


def env_args(environ: Mapping[str, str] | None = None) -> list[str]:
    """``WERK_VLLM_ARGS`` split like a shell would; ``invalid_request`` when it cannot be."""
    raw = (os.environ if environ is None else environ).get(ENV_ARGS, "")
    try:
        return shlex.split(raw)
    except ValueError as err:
        raise _invalid(f"{ENV_ARGS} is not a valid shell-quoted argument list") from err


def generated_args(model_dir: str, served_name: str, settings: LaunchSettings, apc_flag: str | None) -> list[str]:
    """The ``serve ...`` arguments Werk generates (the port as :data:`PORT`), before ``WERK_VLLM_ARGS``."""
    args = ["serve", model_dir, "--host", HOST, "--port", PORT, "--served-model-name", served_name]
    args += settings.option_args()
    if apc_flag is not None:
        args.append(apc_flag)
    return args + pooling_args(settings.pooling)


def pooling_args(pooling: str | None) -> list[str]:
    """The ``vllm serve`` flags of the ``pooling`` option (module docstring); none for chat."""
    if pooling is None:
        return []
    if pooling == RANK:
        return ["--runner", "pooling", "--convert", "classify"]
    config = json.dumps({"pooling_type": POOLING_TYPES[pooling]}, separators=(",", ":"))
    return ["--runner", "pooling", "--convert", "embed", "--pooler-config", config]


def last_value(args: Sequence[str], flag: str) -> str | None:
    """The value of the last ``flag V`` or ``flag=V`` in ``args`` (names as vLLM reads them)."""
    value: str | None = None
    for i, arg in enumerate(args):
        if flag_name(arg) != flag:
            continue
        if "=" in arg:
            value = arg.split("=", 1)[1]
        elif i + 1 < len(args) and flag_name(args[i + 1]) is None:
            value = args[i + 1]
    return value


def int_flag(args: Sequence[str], flag: str) -> int | None:
    """:func:`last_value` as a positive integer, or ``None``."""
    value = last_value(args, flag)
    if value is None or not value.isdigit() or int(value) < 1:
        return None
    return int(value)


def _looks_like_path(arg: str, paths: Iterable[str]) -> bool:
    return arg in paths or os.path.isabs(arg) or (os.sep in arg and os.path.exists(arg))


def display_args(args: Sequence[str], paths: Iterable[str] = ()) -> list[str]:
    """``args`` for a plan: every value of a secret flag is ``<redacted>``, filesystem paths
    (``paths``, absolute ones, existing relative ones) are ``<path>``."""
    known = tuple(paths)
    shown: list[str] = []
    secret = False
    for arg in args:
        name = flag_name(arg)
        if name is not None:
            secret = name in SECRET_FLAGS
            if "=" in arg:
                head, value = arg.split("=", 1)
                if secret:
                    shown.append(f"{head}=<redacted>")
                    secret = False
                else:
                    shown.append(f"{head}=<path>" if _looks_like_path(value, known) else arg)
            else:
                shown.append(arg)
        elif secret:
            shown.append("<redacted>")
        else:
            shown.append("<path>" if _looks_like_path(arg, known) else arg)
    return shown
