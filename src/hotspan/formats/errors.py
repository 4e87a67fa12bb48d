"""The one error every wire-format parser raises for bad input."""


class FormatError(ValueError):
    """The payload is not valid in the format it claims; the message says what is wrong."""
