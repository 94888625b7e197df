"""How a generation runs, as one typed, validated value: :class:`EngineOptions`.

``generate``, ``precompile``, the bench and the command line all take the engine settings through
this one object, so a setting is checked (and its error worded) in one place and a new one is
added in one place. Importing this module does not import torch: the command line builds its
options before it loads anything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dynatree.errors import DynaTreeError

ENGINES = ("auto", "hf", "static")


def check_window(window: object, sinks: object) -> None:
    """Validate StreamingLLM-style eviction settings (``kv_window``, ``kv_sinks``) without torch."""
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise DynaTreeError(f"kv_window must be a positive integer, got {window!r}")
    if not isinstance(sinks, int) or isinstance(sinks, bool) or sinks < 0:
        raise DynaTreeError(f"kv_sinks must be an integer >= 0, got {sinks!r}")
TREE_ORDERS = ("bfs", "dfs")


@dataclass(frozen=True)
class CacheOptions:
    """What a model+cache object is built with (:class:`~dynatree.runtime.cache.StaticCachedModel`'s
    arguments). With the vocabulary size it is the key of the static engine's pool: runs whose
    options agree here share one cache and its compiled graphs, whatever their tree order or
    eviction window."""

    compile: bool = False
    compile_mode: str | None = None
    buckets: tuple[int, ...] | None = None
    cpu_linear: bool = False


@dataclass(frozen=True)
class EngineOptions:
    """The engine settings of :func:`dynatree.generate` (see its docstring for each field).

    ``"auto"`` and None mean "decide for the model": :meth:`resolve` makes those choices for one
    target and returns options in which every field is decided.
    """

    engine: str = "auto"
    compile: bool | str | None = None
    buckets: tuple[int, ...] | None = None
    cpu_linear: bool | None = None
    lazy_head: bool | None = None
    tree_order: str = "bfs"
    kv_window: int | None = None
    kv_sinks: int = 4

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise DynaTreeError(f"unknown engine '{self.engine}': must be 'auto', 'hf' or 'static'")
        if self.compile == "" or (self.compile is not None and not isinstance(self.compile, (bool, str))):
            raise DynaTreeError(f"compile must be True, False, None or a torch.compile mode, got {self.compile!r}")
        if self.compile and self.engine == "hf":
            raise DynaTreeError("compile=True needs engine='static' (compiled steps need fixed shapes)")
        object.__setattr__(self, "buckets", _buckets(self.buckets))
        for name in ("cpu_linear", "lazy_head"):
            if not (getattr(self, name) is None or isinstance(getattr(self, name), bool)):
                raise DynaTreeError(f"{name} must be True, False or None, got {getattr(self, name)!r}")
        if self.tree_order not in TREE_ORDERS:
            raise DynaTreeError(f"unknown tree_order '{self.tree_order}': must be 'bfs' or 'dfs'")
        if self.kv_window is not None:
            check_window(self.kv_window, self.kv_sinks)
            if self.engine == "static":
                raise DynaTreeError("KV eviction (kv_window) works with engine='hf' only")

    def replace(self, **changes: Any) -> EngineOptions:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def merge(cls, options: EngineOptions | None, **keywords: Any) -> EngineOptions:
        """``options=`` and the same settings given as keywords, as one object.

        Keywords left at their defaults defer to ``options``; a keyword that differs from both its
        default and ``options`` is refused, so no setting is silently dropped."""
        given = cls(**keywords)
        if options is None:
            return given
        if not isinstance(options, EngineOptions):
            raise DynaTreeError(f"options must be an EngineOptions, got {type(options).__name__}")
        default = cls()
        clash = [f.name for f in dataclasses.fields(cls)
                 if getattr(given, f.name) not in (getattr(default, f.name), getattr(options, f.name))]
        if clash:
            both = ", ".join(f"{n}={getattr(given, n)!r} vs options.{n}={getattr(options, n)!r}" for n in clash)
            raise DynaTreeError(f"engine settings given twice and different ({both}): pass them in options= "
                                "or as keywords, not both")
        return options

    @property
    def resolved(self) -> bool:
        """Whether nothing is left to decide (what :func:`dynatree.runtime.engines.resolve` returns)."""
        return self.engine != "auto" and self.compile is not None and self.cpu_linear is not None

    def cache_options(self, device_type: str) -> CacheOptions:
        """The model+cache arguments of resolved options on a device of this type (``"cuda"``,
        ``"cpu"``): ``compile=True`` means CUDA graphs (``mode="reduce-overhead"``) on CUDA and the
        default mode elsewhere; a string is the mode itself."""
        if not self.resolved:
            raise DynaTreeError("cache_options needs resolved options: call dynatree.runtime.engines.resolve(options, target) first")
        mode = self.compile if isinstance(self.compile, str) else None
        if self.compile is True and device_type == "cuda":
            mode = "reduce-overhead"
        return CacheOptions(bool(self.compile), mode, self.buckets, bool(self.cpu_linear))


def _buckets(buckets: Sequence[int] | None) -> tuple[int, ...] | None:
    """Buckets as a sorted tuple (hashable, one spelling per set), or the one-line refusal."""
    if buckets is None:
        return None
    try:
        values = tuple(buckets) if not isinstance(buckets, str) else ()
    except TypeError:
        values = ()
    if not values or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in values):
        raise DynaTreeError(f"buckets must be positive integers, got {buckets!r}")
    return tuple(sorted(values))


def parse_buckets(text: str | None) -> tuple[int, ...] | None:
    """``--buckets 1,8,128`` as a tuple (None when the flag is not given)."""
    if text is None:
        return None
    try:
        return tuple(int(b) for b in text.split(",") if b.strip())
    except ValueError:
        raise DynaTreeError(f"--buckets must be comma-separated positive integers, got {text!r}") from None


@dataclass(frozen=True)
class StoppingConfig:
    """When a :func:`dynatree.generate` run stops before ``max_new_tokens``, validated at construction.

    ``eos_token_id``: stop after this token (or any of these; the token is kept, as HF does). None
    uses the target's ``generation_config.eos_token_id``, as HF ``generate`` does; ``()`` never
    stops early. ``stop_strings``: stop once the generated text contains one of these (the token
    completing it is kept, as with HF ``generate(stop_strings=..., tokenizer=...)``); needs
    ``generate(tokenizer=...)`` to decode.

    Sequences are stored as tuples, so two equal configs compare (and hash) equal however they were
    spelled.
    """

    eos_token_id: int | tuple[int, ...] | None = None
    stop_strings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        eos = self.eos_token_id
        if eos is not None and not _is_int(eos):
            ids = _as_tuple(eos)
            if ids is None or not all(_is_int(t) for t in ids):
                raise DynaTreeError(f"eos_token_id must be None, a token id or a sequence of token ids, got {eos!r}")
            object.__setattr__(self, "eos_token_id", tuple(int(t) for t in ids))
        ids = (self.eos_token_id,) if _is_int(self.eos_token_id) else (self.eos_token_id or ())
        if any(t < 0 for t in ids):
            raise DynaTreeError(f"eos_token_id must be >= 0, got {eos!r}")
        strings = [self.stop_strings] if isinstance(self.stop_strings, str) else _as_tuple(self.stop_strings)
        if strings is None or any(not isinstance(x, str) or not x for x in strings):
            raise DynaTreeError(f"stop_strings must be non-empty strings, got {self.stop_strings!r}")
        object.__setattr__(self, "stop_strings", tuple(strings))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _as_tuple(value: object) -> tuple[Any, ...] | None:
    """A list, tuple or other iterable (a tensor's ``.tolist()`` included) as a tuple; None if not iterable."""
    if hasattr(value, "tolist"):
        value = value.tolist()
        if _is_int(value):
            return (value,)
    try:
        return tuple(value)  # type: ignore[arg-type]
    except TypeError:
        return None


__all__ = ["CacheOptions", "EngineOptions", "StoppingConfig", "parse_buckets"]


# ----------------------------------------------------------------- name=value option strings
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
    """``"5"`` -> 5, ``"0.1"`` -> 0.1, ``"true"`` -> True, anything else stays a string."""
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw
