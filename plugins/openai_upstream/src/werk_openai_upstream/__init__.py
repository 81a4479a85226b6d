"""werk-openai-upstream: any OpenAI-compatible server elsewhere as a Werk backend (README.md)."""
