"""Durations of residency settings, and the one bound they all share (docs/deployments.md,
"Durations").

Every idle time the host keeps — a profile's ``keep_alive`` and ``keep_alive_max``, an Ollama
request's ``keep_alive`` — is either "forever" or a finite number of seconds of at most
:data:`MAX_DURATION_S` (one year, ``8760h``). A longer value is refused where it is given (the
profile at start, the request with a 400), never stored: an expiry computed from a stored value
always fits a timestamp.
"""

from __future__ import annotations

import json
import math
import re
from typing import Final

#: The longest finite idle time anything may ask for: one year. Longer means "forever".
MAX_DURATION_S: Final = 365 * 24 * 3600.0
#: The bound as the profile grammar writes it, for messages.
MAX_DURATION_TEXT: Final = "8760h"

DURATION_HINT = '(use 45s, 30m, 2h, 1h30m, "0" or "forever")'
_NUMBER = r"([0-9]+(?:\.[0-9]+)?)"
_DURATION_RE = re.compile(rf"(?:{_NUMBER}h)?(?:{_NUMBER}m)?(?:{_NUMBER}s)?")


def too_long(seconds: float) -> bool:
    """Whether ``seconds`` (finite or not) is above :data:`MAX_DURATION_S` but not forever
    (``math.inf``); ``nan`` counts as too long."""
    return not (seconds <= MAX_DURATION_S or math.isinf(seconds) and seconds > 0)


def bound_message(text: str) -> str:
    return f'{_quote(text)} is longer than the longest finite duration, {MAX_DURATION_TEXT} (one year); use "forever"'


def parse_duration(text: str) -> float | None:
    """Seconds for a profile duration; ``None`` means forever.

    Grammar: ``"forever"``; ``"0"``; or one to three ``<number><unit>`` parts with units ``h``,
    ``m``, ``s`` in that order, each at most once (``45s``, ``30m``, ``2h``, ``1h30m``,
    ``1h0m30s``, ``90m``). A number is digits with an optional decimal fraction (``1.5h``,
    ``0.5s``). No signs, spaces, exponents or other units. At most :data:`MAX_DURATION_S`.
    Raises :class:`ValueError` otherwise.
    """
    if text == "forever":
        return None
    if text == "0":
        return 0.0
    match = _DURATION_RE.fullmatch(text)
    if match is None or not any(match.groups()):
        raise ValueError(f"{_quote(text)} is not a duration {DURATION_HINT}")
    hours, minutes, seconds = (float(part) if part else 0.0 for part in match.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if not math.isfinite(total):
        raise ValueError(f"{_quote(text)} is too long a duration {DURATION_HINT}")
    if total > MAX_DURATION_S:
        raise ValueError(bound_message(text))
    return total


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)
