"""``python -m werk_omlx.worker``: see :mod:`werk_omlx.worker.server`."""

from .server import main

main()
