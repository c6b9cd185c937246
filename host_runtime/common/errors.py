"""The box's one root error, and its families (Home Assistant's HomeAssistantError and its kinds).

Every error the box raises on purpose derives from EveryCycleError, through the family that says whose fault it
is: the input's (a setting, a file, a request: InputError), a part that is not there or not answering right now
(UnavailableError), or the operation's own (EveryCycleError itself). Each family is mapped once to an exit code
(cli.EXIT_CODES) and once to an HTTP status (serving/errors.HTTP_STATUS), so an error no caller handles still
reaches the owner as its message with the right status, never as a traceback. The message is the owner's: what
went wrong and what to do, naming the field or the file."""

from __future__ import annotations


class EveryCycleError(Exception):
    """Something the box could not do, said in the owner's words."""


class InputError(EveryCycleError):
    """What was given cannot be used: a setting, a file, a request's field. The message names it."""


class UnavailableError(EveryCycleError):
    """A part the operation needs is not there or not answering now (a device, a service, the engine); trying
    again later may work."""
