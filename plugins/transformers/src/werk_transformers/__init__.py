"""werk-transformers: Hugging Face checkpoints on transformers and torch, in a Werk-owned worker
process per exact model (docs/transformers.md)."""
