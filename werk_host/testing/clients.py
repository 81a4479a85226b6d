"""Third-party clients pinned from PyPI, each in its own cached virtualenv, for tests that run a
real client against a served host (docs/plugin-kit.md, "Testing").

:func:`client_venv` returns ``CACHE/<dist>-<version>/venv`` with ``dist==version`` installed
(``CACHE/<dist>[<extras>]-<version>/venv`` with ``dist[extras]==version`` when extras are asked
for, e.g. LiteLLM's ``proxy``), where ``CACHE`` defaults to
``${XDG_CACHE_HOME:-~/.cache}/werk/clients``. The install is checked with
``importlib.metadata.version`` and then marked (``installed.json``: the distribution, its
version and this interpreter's version), so a later call only reads the marker; a half-done
install, or one made for another interpreter, is redone. A file lock serializes concurrent calls
for the same pin. pip's output and one progress line per step go to stderr. The client runs as
``VENV/bin/python``, never imported into the test's own interpreter, so its dependencies cannot
clash with the host's.

It imports nothing of the server: a test may call it before any host is built.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

from werk_host.paths import user_cache_dir


def _say(message: str) -> None:
    print(f"[clients] {message}", file=sys.stderr, flush=True)


def client_venv(dist: str, version: str, *, extras: tuple[str, ...] = (), cache: Path | None = None) -> Path:
    """The virtualenv holding ``dist==version`` (with ``extras``) from PyPI, installed on first
    use (see above)."""
    spec = f"{dist}[{','.join(sorted(extras))}]" if extras else dist
    base = (cache if cache is not None else user_cache_dir() / "clients") / f"{spec}-{version}"
    venv = base / "venv"
    python = venv / "bin" / "python"
    marker = base / "installed.json"
    want = {"dist": spec, "version": version, "python": sys.version.split()[0]}
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if python.exists() and json.loads(marker.read_text()) == want:
                _say(f"{spec}=={version}: cached in {venv}")
                return venv
        except (OSError, ValueError):
            pass
        marker.unlink(missing_ok=True)
        _say(f"{spec}=={version}: creating {venv}")
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        _say(f"{spec}=={version}: pip install (from PyPI)")
        pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
        subprocess.run([*pip, f"{spec}=={version}"], check=True, stdout=sys.stderr)
        check = f"import importlib.metadata as m; print(m.version({dist!r}))"
        got = subprocess.run([str(python), "-c", check], check=True, capture_output=True, text=True).stdout.strip()
        if got != version:
            raise RuntimeError(f"{dist}: installed {got}, wanted {version}")
        tmp = marker.with_suffix(".tmp")
        tmp.write_text(json.dumps(want))
        os.replace(tmp, marker)
        _say(f"{spec}=={version}: installed")
    return venv
