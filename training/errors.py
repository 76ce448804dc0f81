"""The two errors the training scripts end with, one line each: exit 2 (bad
input) or 1 (a fault while running)."""

import contextlib

from hf_tinytx.commands.exits import UserInputError


__all__ = ["RunError", "UserInputError", "as_user_input_error"]


class RunError(RuntimeError):
    """A fault met while training (a non-finite loss, a full disk). The message says
    what is intact and what to do."""


@contextlib.contextmanager
def as_user_input_error(*kinds: type[Exception]):
    """The library's refusals of `kinds` (a folder overlap, a link out, a bad
    weights file) as UserInputError."""
    try:
        yield
    except kinds as error:
        raise UserInputError(str(error)) from None
