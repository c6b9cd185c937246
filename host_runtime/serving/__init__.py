"""The OpenAI-compatible HTTP API: routing (app), wire schema (protocol), serving logic (handlers)."""
