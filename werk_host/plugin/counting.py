"""Admission estimates calibrated from a backend's own token counts
(docs/plugin-hooks.md, ``werk_count_tokens``)."""

from __future__ import annotations

from werk_host.service.admission import CALIBRATE_AFTER, calibrate, plain_shape

__all__ = ["CALIBRATE_AFTER", "calibrate", "plain_shape"]
