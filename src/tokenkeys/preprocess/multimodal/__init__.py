"""Multimodal placeholder expansion: one module per processor family, chosen by its class name."""
