"""Thermal-aware power governor: temperatures in, GPU power limits and an admission hint out."""
