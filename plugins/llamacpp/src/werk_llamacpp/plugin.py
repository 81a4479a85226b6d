"""Entry point module for the ``werk`` plugin group (``llamacpp``).

The pluggy hookimpls that expose the llama.cpp backend to Werk host come later,
once the host's hookspecs are settled. This module is intentionally empty.
"""
