"""The ``werk`` command's parser and sub-commands: serve, run, chat, plugins, models, cache and runtime."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from werk_host import __version__
from werk_host.backends.launch import command_of
from werk_host.cli import output
from werk_host.deployments.profile import ProfileError
from werk_host.errors import WerkError

Handler = Callable[[argparse.Namespace], int]

#: The host's commands whose start is on the way to a first answer: their parser is built
#: without the plugins' command modules (docs/operations.md, "Start-up").
SERVING_COMMANDS = frozenset({"serve", "run", "chat"})


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """``werk``'s parser for ``argv`` (default: ``sys.argv[1:]``): every command, the plugins'
    own included, unless ``argv`` names one of :data:`SERVING_COMMANDS`; for ``werk serve``
    its own command alone (docs/operations.md, "Start-up")."""
    parser = argparse.ArgumentParser(prog="werk", description="Werk host")
    parser.add_argument("--version", action="version", version=f"werk-host {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    command = command_of(sys.argv[1:] if argv is None else argv)
    if command == "serve":  # nothing of the client commands on the way to its first answer
        from werk_host.cli import serve

        serve.register(sub)
        return parser
    from werk_host.cli import cache, chat, deployments, doctor, jobs, models, plugins, run, runtime, serve

    serve.register(sub)
    run.register(sub)
    chat.register(sub)
    plugins.register(sub)
    doctor.register(sub)
    models.register(sub)
    cache.register(sub)
    jobs.register(sub)
    runtime.register(sub)
    deployments.register(sub)
    if command not in SERVING_COMMANDS:
        plugin_commands(sub)
    return parser


def plugin_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Each plugin's own ``werk <name> ...`` commands (docs/plugin-kit.md, "Commands"). Only the
    plugins' small ``werk.cli`` modules are imported; a broken one adds nothing and is named in
    one line on stderr."""
    from werk_host.pluginhost import PluginHost

    host = PluginHost()
    problems = host.load_cli_entry_points()
    problems += host.add_cli_commands(sub)
    for name, problem in problems:
        fix = f"see `werk plugins`; WERK_DISABLE_PLUGINS={name} turns the plugin off"
        print(f"werk: plugin {name} {problem} ({fix})", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except WerkError as err:  # one line `werk: ...` (docs/cli.md, "Output and exit codes")
        output.fail(args, err.message, code=err.code.value)
        return 2
    except ProfileError as err:  # nothing started: the message names the file, line and field
        output.fail(args, f"invalid profile: {err}", code="invalid_profile")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
