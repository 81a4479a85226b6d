"""werk-candle-bridge: GGUF models in the werk serve process on mistral.rs (a Candle-based engine)."""
