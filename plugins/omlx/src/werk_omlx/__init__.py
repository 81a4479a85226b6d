"""werk-omlx: MLX checkpoints in a Werk-owned mlx-lm worker with MoE expert offload (docs/omlx.md)."""

__version__ = "0.1.0"
