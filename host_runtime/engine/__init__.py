"""The inference engine: one process holding the only copy of the model's weights."""
