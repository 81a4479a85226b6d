"""Users install only what they need, proved with wheels (README.md, "Install from wheels").

``python -m build --wheel`` builds ``werk-host`` and every plugin under ``plugins/`` (not
``_template``) from a clean copy of its sources; each scenario then installs wheels, with their
declared dependencies from the package index (pip's download cache makes re-runs cheap), into a
fresh virtual environment and drives the installed ``werk`` as a user would:

(a) ``werk-host`` alone: ``werk plugins`` lists none; ``werk serve`` with no model answers
    ``/werk/v1/capabilities`` truthfully (nothing a backend would provide is claimed) and
    ``/v1/models`` (an empty list).
(b) ``werk-host`` + ``werk-llamacpp``: ``werk serve --model <SmolLM2 GGUF>`` (``WERK_LLAMA_SERVER``
    set) serves a chat completion, and ``werk llamacpp build`` ships in the wheel.
(c) ``werk-host`` + ``werk-vllm``: ``werk plugins`` lists only vllm, and neither ``werk plugins``
    nor a ``werk serve`` start imports llama.cpp code or ``gguf``; neither is installed.

Skipped, with the reason, only when ``python -m build`` is not installed or the index cannot be
reached.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = sorted(p for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").is_file() and p.name[0] != "_")
#: What a clean source copy leaves out: build output and caches of the working tree.
IGNORED = shutil.ignore_patterns(".*", "__pycache__", "*.egg-info", "build", "dist", "tests", "*.pyc")
LLAMA_MODULES = ("werk_llamacpp", "gguf", "llama_cpp")


def _index_reachable() -> bool:
    url = os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple"
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        return True
    try:
        socket.create_connection((parsed.hostname or "pypi.org", parsed.port or 443), timeout=10).close()
    except OSError:
        return False
    return True


pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("build") is None, reason="python -m build is not installed"),
    pytest.mark.skipif(not _index_reachable(), reason="the package index is unreachable (no network)"),
]


def _run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{argv} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Distribution name -> wheel, built fresh from clean copies of the sources, in parallel."""
    work = tmp_path_factory.mktemp("wheels")
    out = work / "dist"
    sources = [work / "src" / "host"]
    sources[0].mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, sources[0] / name)
    shutil.copytree(ROOT / "werk_host", sources[0] / "werk_host", ignore=IGNORED)
    for plugin in PLUGINS:
        sources.append(work / "src" / plugin.name)
        shutil.copytree(plugin, sources[-1], ignore=IGNORED)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(src)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for src in sources
    ]
    for src, proc in zip(sources, procs, strict=True):
        log, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"python -m build --wheel {src.name} failed:\n{log}"
    built = {w.name.split("-")[0].replace("_", "-"): w for w in out.glob("*.whl")}
    assert set(built) == {"werk-host"} | {_dist_name(p) for p in PLUGINS}, sorted(built)
    return built


def _dist_name(project: Path) -> str:
    for line in (project / "pyproject.toml").read_text().splitlines():
        if line.startswith("name = "):
            return line.split('"')[1]
    raise AssertionError(f"{project} has no project name")


@pytest.fixture(scope="module")
def venvs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("venvs")


def _venv(root: Path, name: str, wheels: list[Path]) -> Path:
    """A fresh virtual environment with ``wheels`` and their declared dependencies; its bin/."""
    env_dir = root / name
    _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)])
    python = env_dir / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--disable-pip-version-check", "-q"]
    _run([*pip, *map(str, wheels)])
    return env_dir / "bin"


def _user_env(home: Path, **extra: str) -> dict[str, str]:
    """A user's environment: no repository on the path, no developer settings."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "WERK_LLAMA_SERVER", "WERK_DISABLE_PLUGINS", "WERK_API_KEYS", "WERK_PORT")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(WERK_HOME=str(home), **extra)
    return env


@contextmanager
def _serving(argv: list[str], env: dict[str, str], log: Path) -> Iterator[str]:
    """Run ``werk serve`` until it says it is listening; yield its base URL; stop it."""
    with log.open("w") as err:
        proc = subprocess.Popen(argv + ["--port", "0"], stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    try:
        assert proc.stdout is not None
        port = None
        for line in proc.stdout:
            if line.startswith("{") and '"listening"' in line:
                port = json.loads(line)["port"]
                break
        assert port is not None, f"werk serve exited ({proc.poll()}) without listening:\n{log.read_text()[-4000:]}"
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def _get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=60) as resp:
        assert resp.status == 200
        return json.loads(resp.read())


def test_host_alone_serves_the_protocol_truthfully_with_no_backend(
    wheels: dict[str, Path], venvs: Path, tmp_path: Path
) -> None:
    bin_dir = _venv(venvs, "host", [wheels["werk-host"]])
    env = _user_env(tmp_path / "home")
    listed = _run([str(bin_dir / "werk"), "plugins", "--json"], env=env)
    assert json.loads(listed.stdout) == []
    text = _run([str(bin_dir / "werk"), "plugins"], env=env)
    assert "no plugins installed" in text.stdout

    with _serving([str(bin_dir / "werk"), "serve"], env, tmp_path / "serve.log") as base:
        caps = _get(f"{base}/werk/v1/capabilities")
        models = _get(f"{base}/v1/models")
    assert isinstance(caps, dict) and isinstance(models, dict)
    statuses = {c["id"]: c["status"] for c in caps["data"]}
    assert statuses and set(statuses.values()) <= {"supported", "unsupported", "unavailable"}
    # Host memory is sampled by the host itself; every other capability needs a backend.
    assert {cap for cap, status in statuses.items() if status == "supported"} <= {"runtime.memory.telemetry.host"}
    assert statuses["runtime.pd.prefill"] == "unsupported"
    assert models["data"] == []


def test_host_and_llamacpp_serve_a_gguf(wheels: dict[str, Path], venvs: Path, tmp_path: Path) -> None:
    from werk_llamacpp.binary import LlamaServerNotFound, find_llama_server
    from werk_llamacpp.build import PINNED_VERSION

    from werk_host.realmodel import smollm2_gguf

    try:
        llama_server = find_llama_server(use_path=False)
    except LlamaServerNotFound:
        pytest.skip("no llama-server binary: set WERK_LLAMA_SERVER or run `werk llamacpp build`")
    model = smollm2_gguf()
    bin_dir = _venv(venvs, "llamacpp", [wheels["werk-host"], wheels["werk-llamacpp"]])
    env = _user_env(tmp_path / "home", WERK_LLAMA_SERVER=str(llama_server))
    listed = json.loads(_run([str(bin_dir / "werk"), "plugins", "--json"], env=env).stdout)
    assert [(p["name"], p["status"]) for p in listed] == [("llamacpp", "loaded")]

    # The build ships in the wheel, as `werk llamacpp build` (asked only for a cached binary here).
    argv = [str(bin_dir / "werk"), "llamacpp", "build", "--print-path"]
    missing = subprocess.run(argv, capture_output=True, text=True, env={**env, "XDG_CACHE_HOME": str(tmp_path)})
    assert (missing.returncode, missing.stderr) == (
        1,
        f"werk: llama-server {PINNED_VERSION} is not built yet (run `werk llamacpp build`)\n",
    )
    cached = subprocess.run(argv, capture_output=True, text=True, env=env)
    if llama_server.parent.name == PINNED_VERSION:  # found in the default build cache
        assert (cached.returncode, cached.stdout) == (0, f"{llama_server}\n")

    with _serving([str(bin_dir / "werk"), "serve", "--model", str(model)], env, tmp_path / "serve.log") as base:
        models = _get(f"{base}/v1/models")
        assert isinstance(models, dict)
        model_id = models["data"][0]["id"]
        body = {"model": model_id, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8}
        request = urllib.request.Request(
            f"{base}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as resp:
            answer = json.loads(resp.read())
    assert answer["object"] == "chat.completion"
    assert isinstance(answer["choices"][0]["message"]["content"], str)
    assert answer["usage"]["completion_tokens"] >= 1


def _llama_part(part: str) -> bool:
    return part.startswith(("llama", "gguf")) or "llamacpp" in part or "llama_cpp" in part


def test_host_and_vllm_import_no_llama_code(wheels: dict[str, Path], venvs: Path, tmp_path: Path) -> None:
    bin_dir = _venv(venvs, "vllm", [wheels["werk-host"], wheels["werk-vllm"]])
    env = _user_env(tmp_path / "home")
    python = str(bin_dir / "python")
    check = (
        "import importlib.util, json, sys\n"
        "from werk_host.cli import main\n"
        "main(['plugins', '--json'])\n"
        f"mods = {LLAMA_MODULES!r}\n"
        "print(json.dumps({'imported': sorted(m for m in sys.modules if m.split('.')[0] in mods),\n"
        "                  'installed': sorted(m for m in mods if importlib.util.find_spec(m))}))\n"
    )
    out = _run([python, "-c", check], env=env).stdout.splitlines()
    listed = json.loads("\n".join(out[:-1]))
    assert [(p["name"], p["status"]) for p in listed] == [("vllm", "loaded")]
    assert json.loads(out[-1]) == {"imported": [], "installed": []}

    # `werk serve` with no model, in a process that writes its sys.modules when it exits.
    dump = tmp_path / "modules.json"
    serve = (
        "import atexit, json, sys\n"
        f"atexit.register(lambda: open({str(dump)!r}, 'w').write(json.dumps(sorted(sys.modules))))\n"
        "from werk_host.cli import main\n"
        "sys.exit(main(['serve', *sys.argv[1:]]))\n"
    )
    with _serving([python, "-c", serve], env, tmp_path / "serve.log") as base:
        assert _get(f"{base}/v1/models") == {"object": "list", "data": []}
    imported = set(json.loads(dump.read_text()))
    assert "werk_vllm.plugin" in imported and "werk_host.server" in imported  # the plugins were loaded
    assert not {m for m in imported if m.split(".")[0] in LLAMA_MODULES}
    llama_like = [m for m in imported if any(_llama_part(part) for part in m.split("."))]
    assert not llama_like  # (the host's own Ollama routes are no llama.cpp code)
