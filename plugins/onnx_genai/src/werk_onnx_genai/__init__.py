"""werk-onnx-genai: ONNX Runtime GenAI model directories (``genai_config.json``) in a Werk-owned
CPU worker per exact model (docs/onnx-genai.md)."""
