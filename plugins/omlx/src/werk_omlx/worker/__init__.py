"""The Werk-owned MLX worker process: mlx-lm with expert offload behind a small HTTP API (docs/omlx.md)."""
