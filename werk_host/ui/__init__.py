"""The operator's page: static files only (docs/ui.md), served by :mod:`werk_host.http.ui`."""
