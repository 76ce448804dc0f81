"""The error every command of the project ends with on bad input: one line that names the problem and the fix.

The library's commands (generate, chat) and the training scripts print it as `<program>: error: ...` and exit 2.
"""


class UserInputError(ValueError):
    """Bad input (a flag, a folder, a file), found before anything is written. The message says how to fix it."""
