"""werk_vllm.testing: what tests and benchmarks use, never the backend itself.

* :mod:`~werk_vllm.testing.testmodel`: generate a tiny random Llama in Hugging Face format,
  run by path with the vLLM virtualenv's own interpreter (which has torch and transformers):
  ``<vllm venv>/bin/python .../werk_vllm/testing/testmodel.py OUT``.

Nothing the plugin loads at run time (its ``werk`` entry point and every module it imports)
imports this package; a test in the plugin's suite checks that.
"""
