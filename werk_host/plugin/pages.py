"""Page-cache helpers for backend plugins (docs/operations.md, "Model file cache").

Read-only shared mappings of model-file ranges, their residency (``mincore``) and prefaulting
them (``MADV_POPULATE_READ``): :mod:`werk_host.pages`. The model-lifetime guard's leases
on a model's exact files: :mod:`werk_host.filecache`, re-exported as
:mod:`werk_host.plugin.filecache`.
"""

from __future__ import annotations

from werk_host.pages import MADV_POPULATE_READ, PAGE, FileMapping, populate_supported, resident_bytes

__all__ = ["MADV_POPULATE_READ", "PAGE", "FileMapping", "populate_supported", "resident_bytes"]
