"""The model store's typed errors: what the CLI prints (naming the field or the model) instead of a traceback."""


class StoreError(Exception):
    """A store operation refused or failed; the message says why and what to do."""
