"""A plugin's own ``werk <name>`` commands through ``werk_cli_commands`` (docs/plugin-kit.md, "Commands").

Each test installs fake plugin distributions (dist-info with ``werk`` and ``werk.cli`` entry
points) in a folder on ``PYTHONPATH`` and runs the real ``werk`` in a child process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from werk_host.testing.markers import covers_hooks

CLI_MODULE = """
from werk_host import hookimpl


def cmd_hello(args):
    print(f"hello {args.name} from {args.plugin}")
    return args.code


@hookimpl
def werk_cli_commands(subparsers):
    top = subparsers.add_parser("{name}", help="{name} tools")
    commands = top.add_subparsers(dest="{name}_command", required=True)
    hello = commands.add_parser("hello", help="say hello")
    hello.add_argument("--name", default="world")
    hello.add_argument("--code", type=int, default=0)
    hello.set_defaults(handler=cmd_hello, plugin="{name}")
"""

#: The plugin module proper: it records that it was imported (``werk --help`` must not).
PLUGIN_MODULE = """
import os
from pathlib import Path

Path(os.environ["WERK_TEST_IMPORTED"], "{name}").touch()
from {cli} import werk_cli_commands as werk_cli_commands
"""

RAISING_CLI = """
from werk_host import hookimpl


@hookimpl
def werk_cli_commands(subparsers):
    subparsers.add_parser("boom", help="half added, then the hook raises")
    raise RuntimeError("no commands today")
"""

TAKEN_NAME_CLI = """
from werk_host import hookimpl


@hookimpl
def werk_cli_commands(subparsers):
    subparsers.add_parser("serve", help="a plugin that wants the host's command")
"""


def _install(site: Path, name: str, cli_source: str, *, plugin: bool = True) -> None:
    cli = f"werk_fake_{name}_cli"
    (site / f"{cli}.py").write_text(textwrap.dedent(cli_source).replace("{name}", name))
    entry = f"[werk.cli]\n{name} = {cli}\n"
    if plugin:
        module = f"werk_fake_{name}"
        (site / f"{module}.py").write_text(PLUGIN_MODULE.replace("{name}", name).replace("{cli}", cli))
        entry += f"[werk]\n{name} = {module}\n"
    info = site / f"werk_fake_{name}-1.0.0.dist-info"
    info.mkdir()
    meta = ["Metadata-Version: 2.1", f"Name: werk-fake-{name}", "Version: 1.0.0", "Requires-Dist: werk-host>=0.2"]
    (info / "METADATA").write_text("\n".join(meta) + "\n")
    (info / "entry_points.txt").write_text(entry)


@pytest.fixture
def site(tmp_path: Path) -> Path:
    folder = tmp_path / "site"
    folder.mkdir()
    (tmp_path / "imported").mkdir()
    return folder


def _werk(site: Path, *argv: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    root = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), str(root)]),
        "WERK_HOME": str(site.parent / "home"),
        "WERK_TEST_IMPORTED": str(site.parent / "imported"),
        **extra_env,
    }
    return subprocess.run(
        [sys.executable, "-m", "werk_host.cli", *argv], capture_output=True, text=True, env=env, timeout=120
    )


@covers_hooks("werk_cli_commands")
def test_a_plugin_command_is_listed_in_help_and_runs_without_importing_the_plugin(site: Path) -> None:
    _install(site, "fakecmd", CLI_MODULE)
    shown = _werk(site, "--help")
    assert shown.returncode == 0, shown.stderr
    assert "fakecmd" in shown.stdout and "fakecmd tools" in shown.stdout
    assert shown.stderr == ""
    assert not (site.parent / "imported" / "fakecmd").exists(), "werk --help imported the plugin module"

    ran = _werk(site, "fakecmd", "hello", "--name", "werk", "--code", "7")
    assert ran.returncode == 7, ran.stderr
    assert ran.stdout == "hello werk from fakecmd\n"
    assert not (site.parent / "imported" / "fakecmd").exists()

    usage = _werk(site, "fakecmd")  # a plugin's command follows argparse's rules like the host's own
    assert usage.returncode == 2 and "fakecmd" in usage.stderr


def test_a_disabled_plugin_adds_no_command(site: Path) -> None:
    _install(site, "fakecmd", CLI_MODULE)
    assert "fakecmd" in _werk(site, "--help").stdout
    for disabled in ("fakecmd", "*", "other, fakecmd"):
        shown = _werk(site, "--help", WERK_DISABLE_PLUGINS=disabled)
        assert shown.returncode == 0 and "fakecmd" not in shown.stdout, disabled


def test_a_raising_hook_adds_nothing_is_flagged_and_werk_keeps_working(site: Path) -> None:
    _install(site, "fakecmd", CLI_MODULE)
    _install(site, "boomer", RAISING_CLI)
    _install(site, "greedy", TAKEN_NAME_CLI, plugin=False)

    shown = _werk(site, "--help")
    assert shown.returncode == 0
    assert "fakecmd" in shown.stdout and "boom" not in shown.stdout  # the half-added command is gone
    lines = shown.stderr.splitlines()
    assert (
        "werk: plugin boomer werk_cli_commands raised RuntimeError: no commands today "
        "(see `werk plugins`; WERK_DISABLE_PLUGINS=boomer turns the plugin off)"
    ) in lines
    assert any(line.startswith("werk: plugin greedy werk_cli_commands raised ArgumentError") for line in lines)
    assert len(lines) == 2, shown.stderr

    serve = _werk(site, "serve", "--help")  # still the host's own serve
    assert serve.returncode == 0 and "--port" in serve.stdout
    assert _werk(site, "fakecmd", "hello").stdout == "hello world from fakecmd\n"
    assert _werk(site, "boom").returncode == 2

    listed = _werk(site, "plugins", "--json")
    assert listed.returncode == 0, listed.stderr
    records = {r["name"]: r for r in json.loads(listed.stdout)}
    assert records["boomer"]["status"] == "loaded"
    assert records["boomer"]["problems"] == ["werk_cli_commands raised RuntimeError: no commands today"]
    assert records["fakecmd"]["problems"] == []


def test_a_command_module_that_fails_to_import_is_named_in_one_line(site: Path) -> None:
    _install(site, "fakecmd", CLI_MODULE)
    _install(site, "broken", "raise ImportError('missing native library')\n", plugin=False)
    shown = _werk(site, "fakecmd", "hello")
    assert shown.returncode == 0 and shown.stdout == "hello world from fakecmd\n"
    assert shown.stderr.splitlines() == [
        "werk: plugin broken commands failed to load: ImportError: missing native library "
        "(see `werk plugins`; WERK_DISABLE_PLUGINS=broken turns the plugin off)"
    ]


#: A command module that records that it was imported.
RECORDING_CLI = (
    'import os\nfrom pathlib import Path\n\nPath(os.environ["WERK_TEST_IMPORTED"], "{name}-cli").touch()\n' + CLI_MODULE
)


def test_serving_commands_start_without_the_plugins_command_modules(site: Path) -> None:
    """``werk serve``, ``run`` and ``chat`` build their parser without importing any plugin's
    command module (docs/operations.md, "Start-up"); every other command still has them."""
    _install(site, "fakecmd", RECORDING_CLI, plugin=False)
    marker = site.parent / "imported" / "fakecmd-cli"
    for command in ("serve", "run", "chat"):
        shown = _werk(site, command, "--help")
        assert shown.returncode == 0, shown.stderr
        assert not marker.exists(), f"werk {command} imported a plugin's command module"
    listed = _werk(site, "--help")
    assert listed.returncode == 0 and "fakecmd" in listed.stdout
    assert marker.exists()
    marker.unlink()
    assert _werk(site, "fakecmd", "hello").stdout == "hello world from fakecmd\n"
    assert marker.exists()
