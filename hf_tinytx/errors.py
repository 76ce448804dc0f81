"""The error every command ends with on bad input, printed as `<program>: error: ...` with exit status 2."""


class UserInputError(ValueError):
    """Bad input (a flag, a folder, a file), found before anything is written. The message says how to fix it."""
