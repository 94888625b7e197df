"""What every ``dynatree`` command shares, kept free of torch so that ``dynatree --help`` is fast:
one-line errors, ``name=value`` option parsing, thread settings.

Library code (``bench/specs.py``, ``bench/sweep.py``) parses option values with
:func:`parse_value` from here, never from the CLI module.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from .errors import DynaTreeError

F = TypeVar("F", bound=Callable[..., Any])


def friendly_errors(fn: F) -> F:
    """Turn DynaTreeError into a one-line message and exit code 2; Ctrl-C into exit code 130."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except DynaTreeError as err:
            typer.secho(f"error: {err}", fg=typer.colors.RED, err=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            typer.secho("interrupted", err=True)
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def parse_options(items: list[str] | None) -> dict[str, Any]:
    """``["k=5", "tau=0.1", "history=false"]`` -> ``{"k": 5, "tau": 0.1, "history": False}``."""
    options: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise DynaTreeError(f"strategy option '{item}' must look like name=value")
        options[key.strip().replace("-", "_")] = parse_value(raw.strip())
    return options


def parse_value(raw: str) -> Any:
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw


TP_HELP = ("Shard the target over the torchrun processes (tensor parallelism, transformers' tp_plan); the "
           "draft is replicated. Launch: torchrun --nproc-per-node N -m dynatree generate --tp ...")


def set_threads(threads: int | None) -> None:
    if threads is not None:
        import torch

        if threads < 1:
            raise DynaTreeError(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
