"""Terminal chat and one-shot runs (``werk chat``, ``werk run``): docs/chat.md.

* :mod:`werk_host.chat.seam`: the optional backend seam for native session snapshots.
* :mod:`werk_host.chat.archive`: the private conversation archive under ``WERK_HOME/chat-sessions/``.
* :mod:`werk_host.chat.native`: native snapshot files, the ``capability.json`` receipt and the
  lazy restore / observed-reuse rules.
* :mod:`werk_host.chat.stream`: reading an OpenAI ``/v1/chat/completions`` event stream.
* :mod:`werk_host.chat.transport`: the local (in-process backend) and ``--server`` transports.
* :mod:`werk_host.chat.session`: one conversation over a transport.
* :mod:`werk_host.chat.inventory`: chat sessions in ``werk cache list``/``purge``.

Importing this package is cheap: the hook specifications import :mod:`werk_host.chat.seam`.
"""
