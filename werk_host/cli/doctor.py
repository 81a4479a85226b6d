"""``werk doctor``: check this machine for ``werk serve`` and say what to do about each problem
(docs/cli.md, "werk doctor").

Checks, in order, each ``ok``, ``warn`` or ``fail`` with a detail and (unless ``ok``) a fix:

* ``plugin.<name>``: every installed plugin loaded, disabled or failed (with its error); then
  each loaded plugin's own checks of its engines (the ``werk_doctor_checks`` hook:
  llama-server, vLLM, MLX, mistralrs; docs/plugin-kit.md, "Doctor checks");
* ``model.<name>``: every registered manifest readable, its files present with their recorded
  sizes (``--hash`` also recomputes each SHA-256, which reads every byte), and a backend
  installed that accepts it;
* ``port``: the address ``werk serve`` would listen on (``--host``/``--port``, else
  ``WERK_HOST``/``WERK_PORT``, else 127.0.0.1:11434; werk_host/cli/serve.py) is free, else
  who holds it when the system says (Ollama's default is 11434) and a free port to choose; a
  ``WERK_PORT`` that is not a port fails;
* ``home``: ``WERK_HOME`` is an owner-only (0700) directory of this user, or can be created;
* ``disk``: free space under ``WERK_HOME`` (``warn`` below :data:`DISK_WARN_BYTES`, ``fail``
  below :data:`DISK_FAIL_BYTES`);
* ``gpu``: NVIDIA memory telemetry through NVML (:mod:`werk_host.memory.telemetry`): ``ok``
  with the devices' memory, ``warn`` when the binding or a device is missing (memory budgets then
  use host memory only).

Output: one line per check, ``ok|warn|FAIL  name  detail``, an indented ``fix:`` line under
each problem, then a summary line; ``--json`` prints ``{"checks": [...], "summary": {...}}``.
Exit code 0 when no check failed, 1 otherwise. Nothing is started, written or loaded: a plugin's
checks run only bounded ``--version``/``--help`` probes.
"""

from __future__ import annotations

import argparse
import errno
import os
import shutil
import socket
import stat
from pathlib import Path
from typing import Any

from werk_host.cli import DEFAULT_HOST, DEFAULT_PORT, PORT_ENV
from werk_host.cli.output import add_json_flag, emit
from werk_host.cli.plugins import load_plugins, missing_first_party, plugin_fix
from werk_host.cli.serve import listen_address
from werk_host.config import HostConfig
from werk_host.digests import sha256_file
from werk_host.models import ModelManifest, ModelRegistry
from werk_host.paths import werk_home
from werk_host.pluginhost import PluginHost
from werk_host.seam import AdapterFactory, DoctorCheck

#: Who usually listens on a port, named when the system does not say.
KNOWN_PORTS = {11434: "Ollama", 8080: "llama-server", 8000: "vLLM"}
DISK_WARN_BYTES = 10 * 2**30
DISK_FAIL_BYTES = 1 * 2**30
GIB = 2**30


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


# -- plugins -----------------------------------------------------------------------------------
def plugin_checks(host: PluginHost, backends: dict[str, list[str]], config: HostConfig) -> list[DoctorCheck]:
    found: list[DoctorCheck] = []
    own: dict[str, list[DoctorCheck]] = {}
    for plugin_name, check in host.doctor_checks(config):
        own.setdefault(plugin_name, []).append(check)
    for record in sorted(host.records, key=lambda r: r.name):
        name = f"plugin.{record.name}"
        what = f"{record.distribution or record.name} {record.version or ''}".strip()
        if record.status == "loaded":
            offers = ", ".join(backends.get(record.name, [])) or "no backend"
            if record.problems:
                detail = f"{what} loaded ({offers}) but {'; '.join(record.problems)}"
                found.append(DoctorCheck(name, "warn", detail, "report it to the plugin's authors"))
            else:
                found.append(DoctorCheck(name, "ok", f"{what} loaded (backends: {offers})"))
        elif record.status == "disabled":
            found.append(DoctorCheck(name, "ok", f"{what} disabled by WERK_DISABLE_PLUGINS"))
        else:
            found.append(DoctorCheck(name, "fail", f"{what} failed to load: {record.error}", plugin_fix(record)))
        found.extend(own.pop(record.name, []))
    if not backends:
        hint = " ".join(missing_first_party(host).values()) or "werk-llamacpp"
        detail = "no backend plugin loaded: werk serve answers the protocol but serves no model"
        found.append(DoctorCheck("plugins", "warn", detail, f"pip install {hint}"))
    found.extend(check for checks in own.values() for check in checks)  # plugins registered in process
    return found


# -- models ------------------------------------------------------------------------------------
def _model_check(manifest: ModelManifest, factories: list[AdapterFactory], full_hash: bool) -> DoctorCheck:
    name = f"model.{manifest.name}"
    again = f"register it again: werk models add {manifest.name} PATH (or werk models rm {manifest.name})"
    for file in manifest.files:
        path = Path(file.path)
        try:
            st = path.stat()
        except OSError:
            return DoctorCheck(name, "fail", f"{path} is missing", again)
        if st.st_size != file.bytes:
            detail = f"{path} is {st.st_size} bytes, registered as {file.bytes}: it changed"
            return DoctorCheck(name, "fail", detail, again)
        if full_hash:
            try:
                digest = sha256_file(path)
            except OSError as err:
                return DoctorCheck(name, "fail", f"{path} cannot be read ({err.strerror})", again)
            if digest != file.sha256:
                return DoctorCheck(name, "fail", f"{path} no longer has its registered SHA-256", again)
    total = sum(f.bytes for f in manifest.files)
    checked = "sizes and SHA-256 match" if full_hash else "sizes match"
    accepting = [f.backend for f in factories if f.accepts(manifest)]
    pinned = f"pinned to {manifest.backend}" if manifest.backend else "not pinned"
    if manifest.backend and manifest.backend not in {f.backend for f in factories}:
        detail = f"{len(manifest.files)} file(s), {_gib(total)}, {checked}; {pinned}, which is not installed"
        return DoctorCheck(name, "fail", detail, f"install the plugin that offers backend {manifest.backend!r}")
    if not accepting:
        detail = f"{len(manifest.files)} file(s), {_gib(total)}, {checked}; no installed backend accepts it"
        return DoctorCheck(name, "warn", detail, "install a backend plugin for it (werk plugins lists what is missing)")
    detail = f"{len(manifest.files)} file(s), {_gib(total)}, {checked}; served by {accepting[0]} ({pinned})"
    return DoctorCheck(name, "ok", detail)


def model_checks(home: Path, factories: list[AdapterFactory], full_hash: bool) -> list[DoctorCheck]:
    registry = ModelRegistry(home)
    try:
        paths = sorted(registry.dir.glob("*.json")) if registry.dir.is_dir() else []
    except OSError as err:
        return [DoctorCheck("models", "fail", f"{registry.dir} cannot be listed ({err.strerror})", "check its owner")]
    if not paths:
        fix = "werk models add NAME PATH (a GGUF file, or a model directory)"
        return [DoctorCheck("models", "warn", f"no models registered under {home}", fix)]
    found = []
    for path in paths:
        try:
            manifest = registry.get(path.stem)
        except Exception as err:  # a hand-edited or truncated manifest: say which, keep going
            detail = f"{path} is not a readable manifest ({type(err).__name__})"
            found.append(DoctorCheck(f"model.{path.stem}", "fail", detail, f"werk models rm {path.stem}"))
            continue
        if manifest is not None:
            found.append(_model_check(manifest, factories, full_hash))
    return found


# -- port --------------------------------------------------------------------------------------
def _bind_error(host: str, port: int) -> OSError | None:
    """The error binding ``host:port`` as ``werk serve`` does would raise, or ``None``."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as err:
        return err
    family, kind, proto, _name, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as waitress does
        try:
            sock.bind(address)
        except OSError as err:
            return err
    return None


def _holder(port: int) -> str | None:
    """The process listening on ``port``, as ``name (pid N)``, when the system tells us."""
    try:
        import psutil  # type: ignore[import-untyped]

        for conn in psutil.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                try:
                    proc = psutil.Process(conn.pid)
                    cmd = " ".join(proc.cmdline()[:3])
                    name = proc.name()
                except psutil.Error:
                    return f"pid {conn.pid}"
                label = "werk serve" if "werk" in cmd and "serve" in cmd else name
                return f"{label} (pid {conn.pid})"
    except Exception:  # noqa: BLE001 - who holds a port is a courtesy; not knowing is fine
        return None
    return None


def _free_port_after(host: str, port: int) -> int | None:
    for candidate in range(port + 1, min(port + 50, 65536)):
        if _bind_error(host, candidate) is None:
            return candidate
    return None


def port_check(host: str, port: int) -> DoctorCheck:
    err = _bind_error(host, port)
    if err is None:
        return DoctorCheck("port", "ok", f"{host}:{port} is free")
    if err.errno not in (errno.EADDRINUSE, errno.EACCES):
        return DoctorCheck("port", "fail", f"cannot listen on {host}:{port} ({err})", "choose another --host")
    if err.errno == errno.EACCES:
        return DoctorCheck("port", "fail", f"port {port} needs privileges here", "choose a port above 1023: --port")
    holder = _holder(port)
    known = KNOWN_PORTS.get(port)
    who = f" by {holder}" if holder else ""
    usual = f"; {known} uses {port}" if known else ""
    free = _free_port_after(host, port)
    choice = f"--port {free} (or {PORT_ENV}={free})" if free else f"another --port (or {PORT_ENV})"
    if holder and holder.startswith("werk serve"):
        return DoctorCheck(
            "port", "warn", f"port {port} is in use{who}: Werk already listens there", f"for another one, {choice}"
        )
    return DoctorCheck("port", "fail", f"port {port} is in use{who}{usual}", f"choose {choice}")


# -- home, disk, gpu ---------------------------------------------------------------------------
def _existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def home_check(home: Path) -> DoctorCheck:
    try:
        st = os.lstat(home)
    except FileNotFoundError:
        parent = _existing_parent(home)
        if os.access(parent, os.W_OK | os.X_OK):
            return DoctorCheck("home", "ok", f"{home} does not exist yet; werk creates it owner-only (0700)")
        fix = "set WERK_HOME (or --home) to a directory you can write"
        return DoctorCheck("home", "fail", f"{home} cannot be created: {parent} is not writable", fix)
    except OSError as err:
        return DoctorCheck("home", "fail", f"{home} cannot be read ({err.strerror})", "set WERK_HOME (or --home)")
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        fix = "point WERK_HOME (or --home) at a real directory"
        return DoctorCheck("home", "fail", f"{home} is a symlink or not a directory; werk refuses it", fix)
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return DoctorCheck("home", "fail", f"{home} belongs to another user", "set WERK_HOME to a directory of yours")
    mode = stat.S_IMODE(st.st_mode)
    if mode != 0o700:
        detail = f"{home} has mode {mode:04o}: other users can see its keys, models and states"
        return DoctorCheck("home", "warn", detail, f"chmod 700 {home}")
    return DoctorCheck("home", "ok", f"{home} is owner-only (0700)")


def disk_check(home: Path) -> DoctorCheck:
    where = _existing_parent(home)
    try:
        free = shutil.disk_usage(where).free
    except OSError as err:
        return DoctorCheck("disk", "warn", f"free space under {where} unknown ({err.strerror})", "check the mount")
    detail = f"{_gib(free)} free under {where}"
    fix = "free space there, or set WERK_HOME (or --home) on a larger disk"
    if free < DISK_FAIL_BYTES:
        return DoctorCheck("disk", "fail", f"only {detail}: states and caches will not fit", fix)
    if free < DISK_WARN_BYTES:
        return DoctorCheck("disk", "warn", f"only {detail}", fix)
    return DoctorCheck("disk", "ok", detail)


def gpu_check() -> DoctorCheck:
    from werk_host.memory.base import TelemetryError
    from werk_host.memory.telemetry import NvmlAcceleratorSource, is_apple_silicon

    if is_apple_silicon():
        return DoctorCheck("gpu", "ok", "Apple silicon: the GPU shares host memory, which Werk observes")
    source = NvmlAcceleratorSource()
    try:
        sample = source.sample()
    except TelemetryError as err:
        return DoctorCheck(
            "gpu", "warn", f"NVML answered with an error ({err})", "check the NVIDIA driver (nvidia-smi)"
        )
    finally:
        source.close()
    if sample is None:
        reason = source.absent_reason or "no NVIDIA device reports memory"
        if source.absent_reason and "binding" in source.absent_reason:
            return DoctorCheck("gpu", "warn", f"{reason}: no GPU telemetry", "pip install nvidia-ml-py")
        detail = f"{reason}: memory budgets use host memory only"
        return DoctorCheck("gpu", "warn", detail, "nothing to do without an NVIDIA GPU; with one, install its driver")
    detail = f"NVIDIA memory: {_gib(sample.available_bytes)} free of {_gib(sample.capacity_bytes)} (nvml)"
    return DoctorCheck("gpu", "ok", detail)


# -- the command -------------------------------------------------------------------------------
def run_checks(home: Path, address: tuple[str, int] | str, full_hash: bool) -> list[DoctorCheck]:
    """Every check; ``address`` is where ``werk serve`` would listen, or why that is not known."""
    host, port = address if isinstance(address, tuple) else (DEFAULT_HOST, DEFAULT_PORT)
    config = HostConfig(home=home, host=host, port=port)
    plugins, backends = load_plugins(config)
    factories = plugins.adapter_factories(config)
    if isinstance(address, tuple):
        listen = port_check(host, port)
    else:
        listen = DoctorCheck("port", "fail", address, f"set {PORT_ENV} to a port number (1-65535), or pass --port")
    return [
        *plugin_checks(plugins, backends, config),
        *model_checks(home, factories, full_hash),
        listen,
        home_check(home),
        disk_check(home),
        gpu_check(),
    ]


def summary(checks: list[DoctorCheck]) -> dict[str, int]:
    return {status: sum(c.status == status for c in checks) for status in ("ok", "warn", "fail")}


def render_checks(checks: list[DoctorCheck]) -> str:
    width = max((len(c.name) for c in checks), default=0)
    lines = []
    for check in checks:
        label = "FAIL" if check.status == "fail" else check.status
        lines.append(f"{label:<4}  {check.name:<{width}}  {check.detail}")
        if check.fix and check.status != "ok":
            lines.append(f"      fix: {check.fix}")
    counts = summary(checks)
    verdict = "problems to fix" if counts["fail"] else "ready" if not counts["warn"] else "ready, with warnings"
    lines.append(f"{counts['ok']} ok, {counts['warn']} warn, {counts['fail']} fail: {verdict}")
    return "\n".join(lines)


def cmd_doctor(args: argparse.Namespace) -> int:
    try:
        address: tuple[str, int] | str = listen_address(args, dict(os.environ))
    except ValueError as err:  # a WERK_PORT that is not a port: werk serve would refuse it too
        address = str(err)
    checks = run_checks(werk_home(args.home), address, args.hash)
    body = {"checks": [c.as_dict() for c in checks], "summary": summary(checks)}
    emit(args, body, render_checks(checks))
    return 1 if any(c.status == "fail" for c in checks) else 0


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"a port is 1-65535, not {value}")
    return value


def register(sub: Any) -> None:
    p = sub.add_parser(
        "doctor",
        help="check plugins, engines, models, the port, WERK_HOME, disk and GPU; say how to fix each problem",
        description="Check this machine for werk serve: one line per check (ok, warn or FAIL) with the fix "
        "under each problem. Exit code 0 when nothing failed, 1 otherwise.",
    )
    p.add_argument("--home", help="WERK_HOME to check (default: $WERK_HOME or ~/.werk)")
    p.add_argument(
        "--host", default=None, help=f"address werk serve would listen on (default: $WERK_HOST or {DEFAULT_HOST})"
    )
    p.add_argument(
        "--port",
        type=_port,
        default=None,
        help=f"port werk serve would listen on (default: ${PORT_ENV} or {DEFAULT_PORT})",
    )
    p.add_argument("--hash", action="store_true", help="also recompute every model file's SHA-256 (reads every byte)")
    add_json_flag(p)
    p.set_defaults(handler=cmd_doctor)
