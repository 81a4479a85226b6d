"""The argument types and actions several ``werk`` commands share.

Imported by ``werk serve``'s parser, which is built without the other commands' modules (their
client and chat layers are not imported on the way to a start's first answer:
docs/operations.md, "Start-up").
"""

from __future__ import annotations

import argparse
from typing import Any

#: The environment variable a client command reads its API key from.
KEY_ENV = "WERK_API_KEY"


def non_negative(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError("must be a non-negative integer")
    return int(text)


class RefuseKeyOnArgv(argparse.Action):
    """A key option (``--api-key``) that exists only to refuse it without echoing the value (argv
    lands in shell history and in ``/proc/PID/cmdline``, readable by every local user). ``const``
    says where the key goes instead (default: this client's environment variable or prompt)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        instead = self.const or f"set {KEY_ENV} or answer the prompt"
        parser.error(f"the API key is never read from the command line; {instead}")


__all__ = ["KEY_ENV", "RefuseKeyOnArgv", "non_negative"]
