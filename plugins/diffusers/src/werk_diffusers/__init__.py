"""werk-diffusers: Diffusers image pipelines on torch, in one Werk-owned resident worker per host
with a bounded pipeline LRU (docs/diffusers.md)."""
