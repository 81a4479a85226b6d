"""Output for a plugin's ``werk`` commands: text by default, ``--json`` for scripts, one-line
errors (docs/cli.md, "Output"; docs/plugin-kit.md, "Commands"). Kept light: ``werk`` imports a
plugin's command module to build its parser."""

from __future__ import annotations

from werk_host.cli.output import add_json_flag, emit, fail

__all__ = ["add_json_flag", "emit", "fail"]
