"""User-facing errors.

Every problem the user can fix (bad input, missing package, unreadable file) is raised as a
:class:`DynaTreeError` with a one-line message; the CLI prints it without a traceback and exits
with code 2. Anything else is a bug and keeps its traceback.
"""


class DynaTreeError(ValueError):
    """A one-line, user-fixable error (bad argument, missing optional package, unreadable file)."""
