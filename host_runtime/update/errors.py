"""The update component's one error type: what went wrong, in a sentence an owner can act on."""


class UpdateError(Exception):
    """An update that cannot go ahead; nothing of the running slot was touched."""
