"""``werk serve``: its options (with their defaults and the environment they read) and the
start of a host from them (docs/operations.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from werk_host.cli import run, runtime
from werk_host.config import BackendBounds, HostConfig, PersistenceDefaults, ServerLimits, StoreBounds
from werk_host.deployments.durations import MAX_DURATION_S
from werk_host.models import parse_param
from werk_host.paths import werk_home
from werk_host.protocol import MAX_TTL_SECONDS, PersistenceMode, ReusePolicy


# -- serve -------------------------------------------------------------------------------
def _ttl(text: str) -> int:
    value = int(text)
    if not 1 <= value <= MAX_TTL_SECONDS:
        raise argparse.ArgumentTypeError(f"TTL must be 1..{MAX_TTL_SECONDS}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


def _seconds(text: str) -> float:
    """A positive number of seconds, at most the host's duration bound (a year,
    werk_host/deployments/durations.py)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= MAX_DURATION_S:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, at most {MAX_DURATION_S:.0f}")
    return value


def _whole_seconds(text: str) -> int:
    """A positive whole number of seconds, at most the host's duration bound."""
    value = _positive(text)
    if value > MAX_DURATION_S:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_DURATION_S:.0f} seconds (a year)")
    return value


#: Where ``werk serve`` takes keys from instead of argv (which every local user can read in
#: ``/proc/PID/cmdline``): ``--api-key`` is refused with this pointer.
KEY_SOURCES = "put the key in a file given with --api-key-file FILE (one key a line) or in WERK_API_KEYS"
OPERATOR_KEY_SOURCES = "put the key in a file given with --operator-api-key-file FILE or in WERK_OPERATOR_API_KEYS"


def _keys_from(environ: dict[str, str], variable: str, key_file: str | None) -> tuple[str, ...]:
    keys = [k.strip() for k in environ.get(variable, "").split(",") if k.strip()]
    if key_file:
        from werk_host.service.principals import read_key_file

        keys += read_key_file(Path(key_file))
    return tuple(dict.fromkeys(keys))


def collect_api_keys(args: argparse.Namespace, environ: dict[str, str]) -> tuple[str, ...]:
    """The accepted keys: ``WERK_API_KEYS`` (comma-separated) and ``--api-key-file``."""
    return _keys_from(environ, "WERK_API_KEYS", args.api_key_file)


def collect_operator_keys(args: argparse.Namespace, environ: dict[str, str]) -> tuple[str, ...]:
    """The operator keys (docs/deployments.md, "Residency"): ``WERK_OPERATOR_API_KEYS`` and
    ``--operator-api-key-file``."""
    return _keys_from(environ, "WERK_OPERATOR_API_KEYS", args.operator_api_key_file)


def persistence_defaults(args: argparse.Namespace) -> PersistenceDefaults | None:
    granular = (args.persistence_mode, args.persistence_reuse, args.persistence_ttl_seconds)
    if not (args.persistence or args.persistence_pin or any(v is not None for v in granular)):
        return None
    return PersistenceDefaults(
        mode=PersistenceMode(args.persistence_mode or "auto"),
        reuse=ReusePolicy(args.persistence_reuse or "prefer"),
        ttl_seconds=args.persistence_ttl_seconds,
        pin=bool(args.persistence_pin),
    )


def _backend_options(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    options: dict[str, dict[str, Any]] = {}
    for item in args.backend_option or []:
        plugin, _, rest = item.partition(".")
        key, value = parse_param(rest)
        options.setdefault(plugin, {})[key] = value
    return options


def cmd_serve(args: argparse.Namespace) -> int:
    from werk_host.logs import configure_logging
    from werk_host.server import serve
    from werk_host.service.gate import gate_limits

    keys = collect_api_keys(args, dict(os.environ))
    operator_keys = collect_operator_keys(args, dict(os.environ))
    configure_logging(args.log_level, (*keys, *operator_keys))
    config = HostConfig(
        home=werk_home(args.home),
        api_keys=keys,
        operator_api_keys=operator_keys,
        host=args.host,
        port=args.port,
        limits=ServerLimits(
            threads=args.threads,
            connection_limit=args.connection_limit,
            channel_timeout=args.channel_timeout,
            cleanup_interval=args.cleanup_interval,
            request_read_timeout=args.request_read_timeout,
            inference_max=args.inference_max,
            inference_per_key=args.inference_per_key,
            inference_slots=args.inference_slots,
            inference_queue=args.inference_queue,
            inference_wait_s=args.inference_wait,
        ),
        models=tuple(args.model or ()),
        profile=Path(args.profile) if args.profile else None,
        persistence=persistence_defaults(args),
        backend_options=_backend_options(args),
        warmup_tokens=args.warmup_tokens,
        backend_bounds=BackendBounds(
            call_s=args.backend_timeout, first_byte_s=args.backend_first_byte_timeout, idle_s=args.backend_idle_timeout
        ),
        store_bounds=StoreBounds(
            max_states=args.store_max_states,
            max_bytes=args.store_max_bytes,
            max_states_per_key=args.store_max_states_per_key,
            max_bytes_per_key=args.store_max_bytes_per_key,
        ),
    )
    try:
        gate_limits(config.limits)  # refused before anything starts
    except ValueError as err:
        print(json.dumps({"error": {"code": "invalid_request", "message": str(err)}}), file=sys.stderr)
        return 2
    return serve(config)


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve Werk Protocol 1.0 and /v1")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=11434)
    limits = ServerLimits()
    p.add_argument("--threads", type=_positive, default=limits.threads, help="request worker threads")
    p.add_argument(
        "--connection-limit", type=_positive, default=limits.connection_limit, help="open connections served at once"
    )
    p.add_argument(
        "--channel-timeout",
        type=_whole_seconds,
        default=limits.channel_timeout,
        help="seconds before a connection with no request in progress is closed",
    )
    p.add_argument(
        "--cleanup-interval", type=_whole_seconds, default=limits.cleanup_interval, help="seconds between idle sweeps"
    )
    p.add_argument(
        "--request-read-timeout",
        type=_whole_seconds,
        default=limits.request_read_timeout,
        help="seconds a request may take to arrive whole (headers and body), however steadily it trickles",
    )
    # docs/operations.md, "Inference concurrency"
    p.add_argument(
        "--inference-max",
        type=_positive,
        help="generation requests running or queued host-wide, below --threads (default: threads - max(2, threads/4))",
    )
    p.add_argument("--inference-per-key", type=_positive, help="of those, the most one API key holds (default: half)")
    p.add_argument(
        "--inference-slots",
        type=_positive,
        default=limits.inference_slots,
        help="concurrent requests per instance when its backend does not say",
    )
    p.add_argument(
        "--inference-queue",
        type=run.non_negative,
        help="requests waiting per instance beyond its capacity (default: the per-key bound)",
    )
    p.add_argument(
        "--inference-wait",
        type=_seconds,
        default=limits.inference_wait_s,
        help="seconds a queued request waits for its instance before a 503",
    )
    p.add_argument("--api-key", action=runtime.RefuseKeyOnArgv, const=KEY_SOURCES, help=argparse.SUPPRESS)
    p.add_argument("--api-key-file", help="file with one API key per line (or WERK_API_KEYS=a,b)")
    p.add_argument(
        "--operator-api-key", action=runtime.RefuseKeyOnArgv, const=OPERATOR_KEY_SOURCES, help=argparse.SUPPRESS
    )
    p.add_argument(
        "--operator-api-key-file",
        help="file with one operator key per line (or WERK_OPERATOR_API_KEYS=a,b): keys that may load, unload "
        "and pin models",
    )
    p.add_argument(
        "--model",
        action="append",
        help="model manifest NAME or a model file PATH; repeat for more (one instance each, id = name)",
    )
    p.add_argument("--profile", help="deployment profile (TOML; default: WERK_HOME/deployments.toml when present)")
    p.add_argument("--home", help="WERK_HOME (default: $WERK_HOME or ~/.werk)")
    p.add_argument("--persistence", action="store_true", help="server-side Prefill defaults (auto/prefer)")
    p.add_argument("--persistence-mode", choices=[m.value for m in PersistenceMode])
    p.add_argument("--persistence-reuse", choices=[r.value for r in ReusePolicy])
    p.add_argument("--persistence-ttl-seconds", type=_ttl)
    p.add_argument("--persistence-pin", action="store_true")
    p.add_argument(
        "--backend-option",
        action="append",
        metavar="PLUGIN.KEY=VALUE",
        help="backend setting, e.g. llamacpp.llama_server=/path/to/llama-server",
    )
    p.add_argument(
        "--warmup-tokens",
        type=run.non_negative,
        default=0,
        help="0 (default): native servers skip their synthetic warmup; N > 0 enables it where offered",
    )
    bounds = BackendBounds()
    p.add_argument(
        "--backend-timeout",
        type=_seconds,
        default=bounds.call_s,
        help="seconds each short backend call may take (counts, slot reads, inventory)",
    )
    p.add_argument(
        "--backend-first-byte-timeout",
        type=_seconds,
        default=bounds.first_byte_s,
        help="seconds a relayed inference request waits for the backend's answer to begin",
    )
    p.add_argument(
        "--backend-idle-timeout",
        type=_seconds,
        default=bounds.idle_s,
        help="seconds a relayed answer may stay silent before it is ended with an error",
    )
    # docs/states.md, "Quotas"
    p.add_argument("--store-max-states", type=_positive, help="named states the store holds (default: 4096)")
    p.add_argument(
        "--store-max-bytes",
        type=_positive,
        help="bytes the store's states occupy, payload and metadata (default: 64 GiB)",
    )
    p.add_argument(
        "--store-max-states-per-key", type=_positive, help="named states one API key holds (default: a quarter)"
    )
    p.add_argument(
        "--store-max-bytes-per-key", type=_positive, help="bytes one API key's states occupy (default: a quarter)"
    )
    p.add_argument("--log-level", default="info")
    p.set_defaults(handler=cmd_serve)
