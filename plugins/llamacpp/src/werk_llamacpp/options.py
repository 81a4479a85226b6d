"""The options a llama.cpp deployment instance takes, checked when ``werk serve`` starts.

A profile's ``options`` table (docs/deployments.md, "Instance keys") reaches
:func:`validate_options` through the factory (:class:`werk_host.plugin.AdapterFactory`,
``validate_options``) before anything starts, so an unknown name (a typo such as
``frobnicate``) or a bad value (``parallel = 0``) stops ``werk serve`` with one line naming it,
instead of being ignored or failing at first use with a 503:

* ``parallel``, ``ctx``, ``threads``: integers of at least 1 (slots, total context tokens,
  llama-server threads);
* ``warmup_tokens``: an integer of at least 0 (docs/chat.md, "Warmup");
* ``slot_wait_s``: a positive number of seconds, at most a year (the host's duration bound,
  werk_host/deployments/durations.py);
* ``llama_server``: the path of a llama-server executable (a non-empty string);
* ``pooling``: ``none`` (a chat instance), ``mean``, ``cls``, ``last`` or ``rank`` (an
  embedding or reranking instance, werk_llamacpp/embeddings.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

from pydantic import JsonValue

from werk_host.plugin import MAX_DURATION_S

#: ``pooling`` values (werk_llamacpp/embeddings.py imports the same tuple).
POOLINGS: Final = ("none", "mean", "cls", "last", "rank")

#: option name → (the least value, whether fractions are allowed); ``llama_server`` is a path.
_NUMBERS: Final = {
    "parallel": (1, False),
    "ctx": (1, False),
    "threads": (1, False),
    "warmup_tokens": (0, False),
    "slot_wait_s": (0, True),
}
OPTIONS: Final = ("llama_server", "pooling", *sorted(_NUMBERS))


def validate_options(options: Mapping[str, JsonValue]) -> None:
    """Raise :class:`ValueError` naming the first option of ``options`` llama.cpp does not take
    or whose value is out of range (see the module docstring)."""
    for name, value in options.items():
        if name == "llama_server":
            if not isinstance(value, str) or not value.strip():
                raise ValueError("llama_server must be the path of a llama-server executable")
            continue
        if name == "pooling":
            if value not in POOLINGS:
                raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, not {value!r}")
            continue
        if name not in _NUMBERS:
            raise ValueError(f"unknown option {name} (llama.cpp takes {', '.join(OPTIONS)})")
        least, fractions = _NUMBERS[name]
        whole = isinstance(value, int) and not isinstance(value, bool)
        if not (whole or fractions and isinstance(value, float) and math.isfinite(value)):
            kind = "a number" if fractions else "an integer"
            raise ValueError(f"{name} must be {kind}, not {value!r}")
        assert isinstance(value, int | float)  # for the type checker: the line above made sure
        if value < least or (fractions and not 0 < value <= MAX_DURATION_S):
            bound = f"positive and at most {MAX_DURATION_S:.0f}" if fractions else f"at least {least}"
            raise ValueError(f"{name} must be {bound}, not {value!r}")
