"""User-facing errors, and the one validator that raises them for bad arguments and config fields.

Every problem the user can fix (bad input, missing package, unreadable file) is raised as a
:class:`DynaTreeError` with a one-line message; the CLI prints it without a traceback and exits
with code 2. Anything else is a bug and keeps its traceback.
"""


class DynaTreeError(ValueError):
    """A one-line, user-fixable error (bad argument, missing optional package, unreadable file)."""


def check(ok: bool, name: str, allowed: str, value: object) -> None:
    """Raise a one-line error naming the argument or config field, its allowed range and the bad
    value (``invalid top_p=2: must be None or a number in (0, 1]``); every config validates this way."""
    if not ok:
        raise DynaTreeError(f"invalid {name}={value!r}: must be {allowed}")


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its type name when it has none): many library errors
    run over several lines, and the CLI's errors are one line."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
