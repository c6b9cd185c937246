"""The model store: GGUF models kept on the data partition, each with a manifest; add, pull, list, remove, pin."""
