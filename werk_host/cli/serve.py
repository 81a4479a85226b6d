"""``werk serve``: its options (with their defaults and the environment they read) and the
start of a host from them (docs/operations.md, "Start-up"; docs/cli.md, "werk serve").

Contract: the listen address (``--host``/``WERK_HOST``, ``--port``/``WERK_PORT``) is bound
before any backend starts; a bad or unusable one ends the command with exit status 2 and one
line ``werk: ...`` on stderr naming the address and how to choose another, with nothing started.
Once the host listens, the ``listening`` JSON line goes to stdout as before, and stderr gets a
human summary: each instance (id, model, backend, per-request context as far as it is known
without starting a lazy instance) and ready-to-paste lines for curl, the OpenAI, Anthropic and
Ollama base URLs and ``werk run --server``. No key is ever printed; with keys configured the
lines read it from ``$WERK_API_KEY``."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from werk_host.cli import DEFAULT_HOST, DEFAULT_PORT, HOST_ENV, PORT_ENV, start_collecting
from werk_host.cli.arguments import RefuseKeyOnArgv, non_negative
from werk_host.cli.output import fail
from werk_host.config import BackendBounds, HostConfig, PersistenceDefaults, ServerLimits, StoreBounds
from werk_host.deployments.durations import MAX_DURATION_S
from werk_host.deployments.rules import parse_memory
from werk_host.filecache import ENV as CACHE_RELEASE_ENV
from werk_host.filecache import MODES, release_mode
from werk_host.models import parse_param
from werk_host.paths import werk_home
from werk_host.protocol import MAX_TTL_SECONDS, PersistenceMode, ReusePolicy
from werk_host.protocol.deployments import InstanceStateName

if TYPE_CHECKING:
    from werk_host.deployments.instances import Instance
    from werk_host.server import Host

#: The levels ``--log-level`` takes (any case).
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


# -- serve -------------------------------------------------------------------------------
def _ttl(text: str) -> int:
    value = int(text)
    if not 1 <= value <= MAX_TTL_SECONDS:
        raise argparse.ArgumentTypeError(f"TTL must be 1..{MAX_TTL_SECONDS}")
    return value


def _port(text: str) -> int:
    """A TCP port, 0..65535 (0: any free port)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError("must be a port number, 0..65535 (0: any free port)")
    return value


def listen_address(args: argparse.Namespace, environ: dict[str, str]) -> tuple[str, int]:
    """``--host``/``--port``, else ``WERK_HOST``/``WERK_PORT``, else 127.0.0.1:11434. A
    ``WERK_PORT`` that is not a port raises :class:`ValueError` with the one-line message."""
    host = args.host if args.host is not None else (environ.get(HOST_ENV, "").strip() or DEFAULT_HOST)
    if args.port is not None:
        return host, int(args.port)
    text = environ.get(PORT_ENV, "").strip()
    if not text:
        return host, DEFAULT_PORT
    try:
        return host, _port(text)
    except argparse.ArgumentTypeError:
        raise ValueError(f"{PORT_ENV}={text[:32]!r} is not a port number") from None


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


def _size(text: str) -> int:
    """A size such as ``2GiB``, ``512MiB`` or a whole number of bytes; ``0`` allowed."""

    def refuse(_at: object, message: str) -> NoReturn:
        raise argparse.ArgumentTypeError(message)

    value: object = int(text) if text.isdigit() else text
    return parse_memory(refuse, (), value, allow_zero=True)


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


def _listed(values: list[str] | None, environ: dict[str, str], name: str) -> tuple[str, ...]:
    """Comma-separated items of every ``values`` option and of the environment variable ``name``."""
    texts = [*(values or ()), environ.get(name, "")]
    return tuple(dict.fromkeys(item.strip() for text in texts for item in text.split(",") if item.strip()))


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
    from werk_host.serving import AddressError

    try:
        host, port = listen_address(args, dict(os.environ))
    except ValueError as err:
        fail(None, str(err), f"set {PORT_ENV} to 1..65535, or pass --port N")
        return 2
    try:
        release_mode(args.model_cache_release)
    except ValueError as err:
        fail(None, str(err), f"set {CACHE_RELEASE_ENV} to auto, on or off, or pass --model-cache-release")
        return 2
    keys = collect_api_keys(args, dict(os.environ))
    operator_keys = collect_operator_keys(args, dict(os.environ))
    config = HostConfig(
        home=werk_home(args.home),
        api_keys=keys,
        operator_api_keys=operator_keys,
        host=host,
        port=port,
        allowed_hosts=_listed(args.allowed_hosts, dict(os.environ), "WERK_ALLOWED_HOSTS"),
        allowed_origins=_listed(args.allowed_origins, dict(os.environ), "WERK_ALLOWED_ORIGINS"),
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
        max_loaded=args.max_loaded,
        prompt_cache_budget=args.prompt_cache_budget,
        persistence=persistence_defaults(args),
        backend_options=_backend_options(args),
        warmup_tokens=args.warmup_tokens,
        model_cache_release=args.model_cache_release,
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
        message, _, fix = str(err).partition(": raise ")
        fail(None, message, f"raise {fix}" if fix else None)
        return 2
    configure_logging(args.log_level, (*keys, *operator_keys))
    try:
        return serve(config, on_ready=lambda built, bound, at: listening(built, bound, at, sys.stderr))
    except AddressError as err:  # nothing started: the address is bound before any backend
        fail(None, err.message, err.fix)
        return 2


# -- the start print -------------------------------------------------------------------------
def _url_host(host: str) -> str:
    """The host a client on this machine uses for a listen host (any-address → loopback)."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _context(host: Host, instance: Instance) -> str:
    """An instance's per-request context as far as it is known without starting it."""
    view = instance.view()
    if view.state is InstanceStateName.FAILED:
        return f"failed to start: {view.error or 'see the log'}"
    adapter = instance.peek()
    if adapter is None:
        return "starts on first use"
    try:
        limits = host.fleet.hooks.chat_limits(adapter, instance.manifest.name)
    except Exception:  # a backend that cannot say: the summary does not fail the start
        limits = None
    if limits is None or limits.context_tokens is None:
        return "context not reported"
    return f"{limits.context_tokens} tokens per request"


def start_lines(host: Host, bound_host: str, port: int) -> list[str]:
    """The human summary ``werk serve`` prints on stderr once it listens (module docstring)."""
    base = f"http://{_url_host(bound_host)}:{port}"
    keyed = host.auth.enabled
    lines = [f"werk serve: ready on {base}"]
    deployments = host.fleet.deployments
    instances = list(deployments.instances.values()) if deployments is not None else []
    if not instances:
        lines.append("instances: none (no backend: serve a model with --model NAME|PATH or --profile FILE)")
    else:
        lines.append("instances:")
        rows = [(i.id, i.manifest.name, i.backend, _context(host, i)) for i in instances]
        widths = [max(len(row[c]) for row in rows) for c in range(3)]
        for ident, model, backend, context in rows:
            lines.append(
                f"  {ident.ljust(widths[0])}  model {model.ljust(widths[1])}  backend {backend.ljust(widths[2])}"
                f"  context: {context}"
            )
    lines.append("try it (first set WERK_API_KEY to one of the keys this server accepts):" if keyed else "try it:")
    if instances:
        default = deployments.default_id if deployments is not None else instances[0].id
        body = {"model": default, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 32}
        curl = [f"  curl -sS {base}/v1/chat/completions", "-H 'Content-Type: application/json'"]
        if keyed:
            curl.append('-H "Authorization: Bearer $WERK_API_KEY"')
        curl.append("-d " + shlex.quote(json.dumps(body)))
        lines.append(" ".join(curl))
    lines.append(f"  OpenAI base URL:    {base}/v1")
    lines.append(f"  Anthropic base URL: {base}")
    lines.append(f"  Ollama host:        {base}")
    if instances:
        lines.append(f'  werk run --server {base} {shlex.quote(default)} "hello"')
    return lines


def listening(host: Host, bound_host: str, port: int, err: TextIO) -> None:
    """``werk serve`` listens: its start is over (:func:`werk_host.cli.start_collecting`), and it says so."""
    start_collecting()
    announce(host, bound_host, port, err)


def announce(host: Host, bound_host: str, port: int, err: TextIO) -> None:
    err.write("\n".join(start_lines(host, bound_host, port)) + "\n")
    err.flush()


class _DefaultsFormatter(argparse.RawDescriptionHelpFormatter):
    """Help that shows each option's default (unless its text already says it); the
    description and epilog are printed as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or not action.option_strings or action.default in (None, False, argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)"


ENVIRONMENT = f"""environment:
  {HOST_ENV}, {PORT_ENV}       the listen address when --host/--port are not given
  WERK_HOME                  where models, states and keys live (--home)
  WERK_API_KEYS              comma-separated API keys clients must send (with --api-key-file)
  WERK_OPERATOR_API_KEYS     comma-separated operator keys (with --operator-api-key-file)
  WERK_ALLOWED_HOSTS         comma-separated Host names a browser may use (with --allowed-hosts)
  WERK_ALLOWED_ORIGINS       comma-separated cross origins a browser may call from (with --allowed-origins)

On start, werk serve prints its instances and ready-to-paste lines (curl, base URLs,
werk run) on stderr; see docs/cli.md, "werk serve"."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="serve Werk Protocol 1.0 and /v1",
        description="Serve Werk Protocol 1.0, OpenAI /v1, Anthropic and Ollama routes for the configured models.",
        epilog=ENVIRONMENT,
        formatter_class=lambda prog: _DefaultsFormatter(prog, max_help_position=36),
    )
    p.add_argument(
        "--host",
        help=f"address to listen on (default: ${HOST_ENV}, else {DEFAULT_HOST}; 0.0.0.0 for every interface)",
    )
    p.add_argument(
        "--port",
        type=_port,
        help=f"port to listen on (default: ${PORT_ENV}, else {DEFAULT_PORT}, which is also Ollama's; 0: any free port)",
    )
    p.add_argument(
        "--allowed-hosts",
        action="append",
        metavar="NAMES",
        help="comma-separated Host names accepted besides localhost, loopback addresses, the bound address and "
        "this machine's name; '*': any (default: none; docs/operations.md, \"Browser safety\")",
    )
    p.add_argument(
        "--allowed-origins",
        action="append",
        metavar="ORIGINS",
        help="comma-separated origins whose pages may call this host, e.g. http://localhost:3000, patterns "
        "like http://localhost:*, or '*' (default: none: only /ui, same-origin)",
    )
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
        type=non_negative,
        help="requests waiting per instance beyond its capacity (default: the per-key bound)",
    )
    p.add_argument(
        "--inference-wait",
        type=_seconds,
        default=limits.inference_wait_s,
        help="seconds a queued request waits for its instance before a 503",
    )
    p.add_argument("--api-key", action=RefuseKeyOnArgv, const=KEY_SOURCES, help=argparse.SUPPRESS)
    p.add_argument(
        "--api-key-file",
        metavar="FILE",
        help="file with one API key per line, added to WERK_API_KEYS=a,b (default: none; no keys: every "
        "request is the shared local principal)",
    )
    p.add_argument("--operator-api-key", action=RefuseKeyOnArgv, const=OPERATOR_KEY_SOURCES, help=argparse.SUPPRESS)
    p.add_argument(
        "--operator-api-key-file",
        metavar="FILE",
        help="file with one operator key per line, added to WERK_OPERATOR_API_KEYS=a,b: keys that may load, unload "
        "and pin models (default: none)",
    )
    p.add_argument(
        "--model",
        action="append",
        metavar="NAME|PATH",
        help="model manifest NAME or a model file PATH; repeat for more (one instance each, id = name; "
        "default: none, see --profile)",
    )
    p.add_argument(
        "--profile",
        metavar="FILE",
        help="deployment profile (TOML; default: WERK_HOME/deployments.toml when present, else no backend)",
    )
    p.add_argument(
        "--max-loaded",
        type=_positive,
        metavar="N",
        help="instances loaded at once; a start beyond it unloads the least recently used idle one "
        "(default: the profile's [residency] max_loaded, else no limit; docs/deployments.md)",
    )
    p.add_argument(
        "--prompt-cache-budget",
        type=_size,
        metavar="SIZE",
        help="disk budget of each instance's automatic prompt caches, e.g. 2GiB; 0 turns them off "
        "(default: 4GiB, or the instance's prompt_cache in the profile; docs/prompt-cache.md)",
    )
    p.add_argument("--home", metavar="DIR", help="WERK_HOME (default: $WERK_HOME, else ~/.werk)")
    p.add_argument(
        "--persistence",
        action="store_true",
        help="turn on server-side Prefill defaults: mode auto, reuse prefer (default: off)",
    )
    p.add_argument(
        "--persistence-mode",
        choices=[m.value for m in PersistenceMode],
        help="Prefill persistence mode for requests that name none (default: auto once any --persistence* "
        "option is given)",
    )
    p.add_argument(
        "--persistence-reuse",
        choices=[r.value for r in ReusePolicy],
        help="Prefill reuse policy for requests that name none (default: prefer once any --persistence* "
        "option is given)",
    )
    p.add_argument(
        "--persistence-ttl-seconds",
        type=_ttl,
        metavar="N",
        help=f"TTL of persisted states, 1..{MAX_TTL_SECONDS}, for requests that name none (default: none, "
        "the protocol's)",
    )
    p.add_argument(
        "--persistence-pin",
        action="store_true",
        help="pin persisted states for requests that do not say (default: off)",
    )
    p.add_argument(
        "--backend-option",
        action="append",
        metavar="PLUGIN.KEY=VALUE",
        help="backend setting, repeatable, e.g. llamacpp.llama_server=/path/to/llama-server (default: none)",
    )
    p.add_argument(
        "--warmup-tokens",
        type=non_negative,
        default=0,
        help="0 (default): native servers skip their synthetic warmup; N > 0 enables it where offered",
    )
    p.add_argument(
        "--model-cache-release",
        choices=MODES,
        help="drop a model's files from the page cache when its instance unloads: on, off, or auto "
        "(on under WSL only); default: $WERK_MODEL_CACHE_RELEASE, else auto (docs/operations.md)",
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
    p.add_argument(
        "--log-level",
        type=str.lower,
        choices=LOG_LEVELS,
        default="info",
        help="the least severe log records written to stderr (JSON lines)",
    )
    for action in p._actions:  # metavars saying what a value is
        if action.metavar is None and action.option_strings and action.nargs != 0:
            if action.type in (_seconds, _whole_seconds):
                action.metavar = "SECONDS"
            elif action.type in (_positive, non_negative):
                action.metavar = "N"
    p.set_defaults(handler=cmd_serve)
