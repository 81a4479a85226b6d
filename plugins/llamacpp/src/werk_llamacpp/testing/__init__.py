"""werk_llamacpp.testing: what tests and benchmarks use, never the backend itself.

* :mod:`~werk_llamacpp.testing.testmodel`: generate a tiny random-weight llama GGUF
  (``python -m werk_llamacpp.testing.testmodel OUT.gguf``; needs the ``testmodel`` extra:
  gguf and numpy).
* :mod:`~werk_llamacpp.testing.hosts`: a host serving llama.cpp instances from a profile.

Nothing the plugin loads at run time (its ``werk`` and ``werk.cli`` entry points and every
module they import) imports this package; a test in the plugin's suite checks that.
"""
