"""werk_omlx.testing: what tests, demos and benchmarks use, never the backend itself.

* :mod:`~werk_omlx.testing.testmodel`: generate small random-weight ``qwen3_moe`` MLX
  checkpoints (``python -m werk_omlx.testing.testmodel OUT``; needs mlx, mlx-lm and tokenizers,
  which the plugin's own dependencies install where MLX runs).

Nothing the plugin loads at run time (its ``werk`` entry point, every module it imports and the
MLX worker) imports this package; a test in the plugin's suite checks that.
"""
