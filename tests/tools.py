"""Tests that need a program outside Python (a real terminal, a browser).

On a developer's machine without the program such a test is skipped, with the reason. Under CI
(``CI=true``) it fails instead: ``.ci/run`` installs those programs, and a skip there would let a run
pass with the test never run (an install that failed once hid the terminal and browser tests).
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Callable
from typing import Any

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


def needs_tool(name: str, why: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a test that runs the program ``name`` (``why``: what it checks with it)."""

    def decorate(test: Callable[..., Any]) -> Callable[..., Any]:
        if shutil.which(name) is not None:
            return test
        if not in_ci():
            return pytest.mark.skip(reason=f"needs {name} ({why})")(test)

        @functools.wraps(test)
        def missing(*args: Any, **kwargs: Any) -> None:
            pytest.fail(f"{name} is missing on this CI machine ({why}): .ci/run installs it, and a skip here "
                        "would pass the run without the test")

        return missing

    return decorate
