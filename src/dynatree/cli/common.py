"""What every ``dynatree`` command shares, kept free of torch so that ``dynatree --help`` is fast:
one-line errors, ``name=value`` option parsing, thread settings, and flags declared once for
several commands (:func:`option_group`; the engine's flags: :func:`engine_flags`).

``name=value`` parsing itself lives in :mod:`dynatree.options` (torch- and typer-free), so the
library's spec strings and the CLI share one syntax without the library importing the CLI.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypeVar

import typer

from dynatree.errors import DynaTreeError
from dynatree.options import EngineOptions, parse_buckets

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
        except RuntimeError as err:
            if not after_interrupt(err):
                raise
            typer.secho("interrupted", err=True)
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def after_interrupt(err: BaseException) -> bool:
    """Whether ``err`` was raised while a Ctrl-C unwound the stack. A KeyboardInterrupt that lands
    inside a torch function mode's ``__enter__``/``__exit__`` (the CPU linear layouts are such
    modes) leaves the mode stack one short, and the next ``__exit__`` raises "trying to pop from
    empty mode stack" with the interrupt as its context: still the user's Ctrl-C, not a bug."""
    seen = err.__context__
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__context__
    return False


def check_utf8(text: str, what: str) -> None:
    """Refuse text that did not arrive as valid UTF-8, in one line naming ``what`` and the offset
    of the first bad byte.

    Python hands undecodable bytes of the command line (and of stdin, see ``dynatree chat``) over
    as lone surrogates (``surrogateescape``); no tokenizer can encode those, and the failure would
    surface as a TypeError deep inside it.
    """
    try:
        text.encode("utf-8")
        return
    except UnicodeEncodeError as err:
        index = err.start
    offset = len(text[:index].encode("utf-8"))
    code = ord(text[index])
    bad = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"character U+{code:04X}"
    raise DynaTreeError(f"{what} is not valid UTF-8: {bad} at byte offset {offset}")


TP_HELP = ("Shard the target over the torchrun processes (tensor parallelism, transformers' tp_plan); the "
           "draft is replicated. Launch: torchrun --nproc-per-node N -m dynatree generate --tp ...")


def set_threads(threads: int | None) -> None:
    if threads is not None:
        import torch

        if threads < 1:
            raise DynaTreeError(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)


def flag(name: str, annotation: Any, default: Any = inspect.Parameter.empty) -> inspect.Parameter:
    """One command-line flag of an :func:`option_group`: typer reads it as it reads a parameter."""
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def option_group(name: str, build: Callable[..., Any], flags: Sequence[inspect.Parameter]) -> Callable[[F], F]:
    """Give a command's parameter ``name`` on the command line as ``flags``, which the command
    receives as one value, ``build(**their values)``.

    Flags that several commands share are so declared once: typer reads a command's flags from its
    signature, so the decorated command shows typer its own parameters and then ``flags`` in place
    of ``name``. Put :func:`friendly_errors` above it: ``build`` may refuse the values.
    """

    def decorate(fn: F) -> F:
        sig = inspect.signature(fn, eval_str=True)
        if name not in sig.parameters:
            raise TypeError(f"{fn.__name__} has no parameter {name!r} for its option group")
        own = [p for p in sig.parameters.values() if p.name != name]
        names = [f.name for f in flags]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            values = {n: kwargs.pop(n) for n in names if n in kwargs}
            return fn(*args, **kwargs, **{name: build(**values)})

        wrapper.__signature__ = sig.replace(parameters=[*own, *flags])  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in [*own, *flags]}
        return wrapper  # type: ignore[return-value]

    return decorate


def dataclass_flags(name: str, cls: type, **defaults: Any) -> Callable[[F], F]:
    """An :func:`option_group` of the fields of the dataclass ``cls`` (annotated like typer
    parameters): the command's parameter ``name`` receives a ``cls``. ``defaults`` override the
    fields' own defaults for this command."""
    hints = typing.get_type_hints(cls, include_extras=True)
    flags = [flag(f.name, hints[f.name], defaults.pop(f.name, f.default)) for f in dataclasses.fields(cls)]
    if defaults:
        raise TypeError(f"{cls.__name__} has no field(s) {', '.join(defaults)}")
    return option_group(name, cls, flags)


def engine_flags(engine: str = "auto") -> Callable[[F], F]:
    """The engine's flags (``--engine``, ``--compile``, ``--buckets``, ``--kv-window``,
    ``--kv-sinks``, ``--cpu-linear``) for a command whose ``options`` parameter then receives them
    as one :class:`~dynatree.options.EngineOptions`. ``engine`` is the default engine: the bench
    records an explicit one in every row, so it has no "auto"."""
    auto = ("auto (aot on a CPU once its packages are built, or for a run long enough to repay building them; "
            "compiled static on CUDA or with --compile; else hf) | "
            if engine == "auto" else "")
    flags = [
        flag("engine", Annotated[str, typer.Option(
            help=f"{auto}hf (dynamic cache) | static (pre-allocated cache, bucketed trees) | aot (ahead-of-time "
                 "compiled steps on a CPU, built once per model and machine)")], engine),
        flag("compile", Annotated[bool | None, typer.Option("--compile/--no-compile", help=(
            "torch.compile the static engine's steps (every graph is built before the run; default: "
            f"{'decided by --engine auto, off otherwise' if auto else 'off'})."))], None),
        flag("buckets", Annotated[str | None, typer.Option(help=(
            "Static engine query buckets, e.g. 1,8,128 (fewer = fewer compiled graphs; default 1,2,4,...,256)."))],
             None),
        flag("kv_window", Annotated[int | None, typer.Option(help=(
            "StreamingLLM-style KV eviction: keep the sinks + this many recent tokens (runs may exceed the "
            "models' context)."))], None),
        flag("kv_sinks", Annotated[int, typer.Option(help="Attention-sink tokens kept with --kv-window.")], 4),
        flag("cpu_linear", Annotated[bool | None, typer.Option("--cpu-linear/--no-cpu-linear", help=(
            "Few-row linear kernels on CPU: --cpu-linear forces the layout tuned on an AMD EPYC, --no-cpu-linear keeps "
            "F.linear (default: the kernel per row count measured on this CPU at first use; see "
            "dynatree.runtime.kernels.linear_plan)."))],
             None),
    ]

    def build(buckets: str | None = None, **values: Any) -> EngineOptions:
        return EngineOptions(buckets=parse_buckets(buckets), **values)

    return option_group("options", build, flags)
