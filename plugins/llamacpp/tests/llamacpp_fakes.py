"""A fake llama-server (shell script) for tests that do not need a real one."""

from __future__ import annotations

import os
from pathlib import Path

FAKE_HELP = """\
----- common params -----

-h,    --help, --usage                  print usage and exit
--version                               show version and build info
-t,    --threads N                      number of CPU threads to use during generation (default: -1)
                                        (env: LLAMA_ARG_THREADS)
-c,    --ctx-size N                     size of the prompt context (default: 4096, 0 = loaded from model)
-m,    --model FNAME                    model path to load
--warmup, --no-warmup                   whether to perform warmup with an empty run (default: enabled)
                                        - none: do not use any, -1 = disabled, see --not-a-real-flag

----- example-specific params -----

-np,   --parallel N                     number of server slots (default: -1, -1 = auto)
--host HOST                             ip address to listen on (default: 127.0.0.1)
--port PORT                             port to listen (default: 8080)
--slot-save-path PATH                   path to save slot kv cache (default: disabled)
--api-key KEY                           API key to use for authentication, multiple keys can be provided as a
                                        comma-separated list (default: none)
                                        (env: LLAMA_API_KEY)
"""


def write_fake_server(
    directory: Path, *, serve: str = "sleep 60", name: str = "llama-server", help_text: str = FAKE_HELP
) -> Path:
    """Write an executable that answers --help/--version like llama-server and otherwise runs ``serve``.

    Every invocation appends its arguments to ``<directory>/<name>.calls``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    calls = directory / f"{name}.calls"
    help_file = directory / f"{name}.help"
    help_file.write_text(help_text)
    path.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "{calls}"\n'
        'case "$1" in\n'
        f'  --help) cat "{help_file}" ;;\n'
        '  --version) echo "version: 1 (fake)" >&2 ;;\n'
        f"  *) echo 'fake llama-server starting'; {serve} ;;\n"
        "esac\n"
    )
    os.chmod(path, 0o755)
    return path


def calls(path: Path) -> list[str]:
    f = path.with_name(path.name + ".calls")
    return f.read_text().splitlines() if f.exists() else []
