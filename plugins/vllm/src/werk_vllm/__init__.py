"""werk-vllm: a Werk host backend over local managed and remote vLLM servers (docs/vllm.md)."""

__version__ = "0.1.0"
