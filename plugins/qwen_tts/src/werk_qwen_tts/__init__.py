"""werk-qwen-tts: Qwen3-TTS speech (the PyPI ``qwen-tts`` package on torch) in one Werk-owned
resident worker per host with a bounded model LRU (docs/media.md, "Speech").

This package imports nothing at import time: the engine virtualenv, which has no Werk, runs
``python -m werk_qwen_tts.testing.testmodel`` through it."""
