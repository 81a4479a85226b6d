"""werk_qwen_tts.testing: what tests and benchmarks use (the tiny model writer), never the backend itself."""
