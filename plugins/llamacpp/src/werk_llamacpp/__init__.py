"""Werk host plugin for llama.cpp: a managed ``llama-server`` child with functionally probed slot state."""

__version__ = "0.1.0"
