"""werk_host.testing: the test kit for the host and for any backend plugin's own suite.

Shipped in the werk-host wheel and registered as the pytest plugin ``werk_host`` (entry point
``pytest11``), so a plugin's tests get its fixtures without a conftest.

* :mod:`~werk_host.testing.reference`: the reference backend, an in-memory plugin
  (:class:`MemoryBackendPlugin`, :class:`MemoryAdapter`) implementing every hook of
  :mod:`werk_host.hookspecs`, with configurable capability statuses and failure injection.
* :mod:`~werk_host.testing.hosts`: build a host around any plugin object or module and serve
  it on an ephemeral port (:func:`make_host`, :func:`running`, :func:`serving`,
  :func:`backend_host`, :func:`install_model`).
* :mod:`~werk_host.testing.api`: :class:`Api`, a tiny JSON-over-HTTP caller for real servers.
* :mod:`~werk_host.testing.processes`: :func:`gone`, wait for a process to exit.
* :mod:`~werk_host.testing.clients`: :func:`client_venv`, a pinned PyPI client in its own cached
  virtualenv, for tests that run a real third-party client.
* :mod:`~werk_host.testing.hostile`: the hostile-body corpus for the ``/v1``, ``/v1/messages`` and
  ``/api`` routes and its checker (:func:`corpus`, :func:`problems`, :func:`send`).
* :mod:`~werk_host.testing.markers`: :func:`covers_hooks`, tag tests with the hooks they cover.
* :mod:`~werk_host.testing.host`: the host itself for a plugin's tests (:func:`build_host`,
  :class:`PluginHost`, :class:`ModelRegistry`, :func:`werk_main`, ...).
* :mod:`~werk_host.testing.pytest_plugin`: fixtures ``werk_home``, ``werk_api_key`` and
  ``werk_server`` (a :class:`WerkServerFactory`), and the ``llamaserver``/``slow`` markers.

Import names from those modules. This package itself imports nothing, so loading the pytest
plugin does not import the server.
"""
