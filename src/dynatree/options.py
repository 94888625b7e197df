"""How a generation runs, as one typed, validated value: :class:`EngineOptions`.

``generate``, ``precompile``, the bench and the command line all take the engine settings through
this one object, so a setting is checked (and its error worded) in one place and a new one is
added in one place. Importing this module does not import torch: the command line builds its
options before it loads anything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dynatree.errors import DynaTreeError

ENGINES = ("auto", "hf", "static", "aot")


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
    linear_plan: LinearPlan | None = None  # the few-row linear kernels (None: F.linear throughout)


@dataclass(frozen=True)
class EngineOptions:
    """The engine settings of :func:`dynatree.generate` (see its docstring for each field).

    ``"auto"`` and None mean "decide for the model": :meth:`resolve` makes those choices for one
    target and returns options in which every field is decided.

    ``cpu_linear`` and ``linear_plan``: which kernel each few-row linear call takes on a CPU
    (:mod:`dynatree.runtime.kernels.linear_plan`). ``cpu_linear=None`` measures the plan on this
    machine at first use (cached on disk) unless ``linear_plan`` pins one; True forces the layout
    tuned on a 2-core AMD EPYC; False keeps ``F.linear`` (what HF runs). Resolved options carry
    the plan the run uses.

    ``pool``: where the static engine keeps its model+cache objects, and the graphs compiled
    against them, between calls (a :class:`dynatree.runtime.engines.StaticPool`). ``"auto"`` takes
    the static engine on a CPU when this pool already holds compiled graphs for the model (what
    :func:`dynatree.precompile` builds); None keeps them in the process's default pool, which only
    spares recompiling and never changes what ``"auto"`` decides. Not part of the options' equality.

    ``screened_head``: greedy acceptance reads the argmax of the target's LM head through an int8
    copy of its weights that rules tokens out by a proven bound, and the fp32 head on the few it
    cannot (:mod:`dynatree.runtime.kernels.screened_head`). None: wherever the head is computed
    lazily (``lazy_head``: a CPU) and this machine's int8 product passes its self-test; False: the
    fp32 head on every row read.
    """

    engine: str = "auto"
    compile: bool | str | None = None
    buckets: tuple[int, ...] | None = None
    cpu_linear: bool | None = None
    lazy_head: bool | None = None
    screened_head: bool | None = None
    tree_order: str = "bfs"
    kv_window: int | None = None
    kv_sinks: int = 4
    linear_plan: LinearPlan | None = None
    pool: Any = dataclasses.field(default=None, compare=False, repr=False)  # a StaticPool (see above)

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise DynaTreeError(f"unknown engine '{self.engine}': must be 'auto', 'hf', 'static' or 'aot'")
        if self.compile == "" or (self.compile is not None and not isinstance(self.compile, (bool, str))):
            raise DynaTreeError(f"compile must be True, False, None or a torch.compile mode, got {self.compile!r}")
        if self.compile and self.engine == "hf":
            raise DynaTreeError("compile=True needs engine='static' (compiled steps need fixed shapes)")
        if self.compile and self.engine == "aot":
            raise DynaTreeError("compile= applies to engine='static'; engine='aot' is compiled ahead of time already")
        object.__setattr__(self, "buckets", _buckets(self.buckets))
        for name in ("cpu_linear", "lazy_head", "screened_head"):
            if not (getattr(self, name) is None or isinstance(getattr(self, name), bool)):
                raise DynaTreeError(f"{name} must be True, False or None, got {getattr(self, name)!r}")
        if not (self.linear_plan is None or isinstance(self.linear_plan, LinearPlan)):
            raise DynaTreeError(f"linear_plan must be a LinearPlan or None, got {self.linear_plan!r}")
        if self.tree_order not in TREE_ORDERS:
            raise DynaTreeError(f"unknown tree_order '{self.tree_order}': must be 'bfs' or 'dfs'")
        if self.kv_window is not None:
            check_window(self.kv_window, self.kv_sinks)
            if self.engine in ("static", "aot"):
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
        return CacheOptions(bool(self.compile), mode, self.buckets, self.linear_plan if self.cpu_linear else None)


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
    ``generate(tokenizer=...)`` to decode. ``pad_token_id``: what a batch's sequences are padded
    with (its prompts' left padding, and the tail of a row that stopped before the longest); None:
    the target's ``generation_config.pad_token_id``, else its first EOS token, else 0 (HF's rule).

    Sequences are stored as tuples, so two equal configs compare (and hash) equal however they were
    spelled.
    """

    eos_token_id: int | tuple[int, ...] | None = None
    stop_strings: tuple[str, ...] = ()
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.pad_token_id is not None and (not _is_int(self.pad_token_id) or self.pad_token_id < 0):
            raise DynaTreeError(f"pad_token_id must be None or a token id >= 0, got {self.pad_token_id!r}")
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


# ------------------------------------------------------------------- few-row linear kernels (CPU)
#: The kernels a few-row linear call may take on a CPU, all computing ``F.linear``'s product up to
#: float summation order (:mod:`dynatree.runtime.kernels.cpu_linear`): ``F.linear`` itself (what
#: HF's own ``generate`` runs), ``(W @ x.T).T`` copied back to row-major order, and oneDNN's product
#: with weights packed once per tensor. Which one wins by row count is measured on the user's CPU
#: (:mod:`dynatree.runtime.kernels.linear_plan`).
KERNELS = ("linear", "rowmajor", "onednn", "packed")


@dataclass(frozen=True)
class LinearPlan:
    """Kernels by row count: ``bands`` is ascending ``(max_rows, kernel)``; a call of ``rows`` rows
    takes the kernel of the first band with ``rows <= max_rows``; past the last band, ``F.linear``.

    ``head``: the bands of the LM head's own calls on final hidden states (the lazy head's, which
    acceptance makes apart from the step), None: the same as ``bands``. Why apart: one large
    weight of another shape than the layers' picks its own kernel. On the 2-core Intel Xeon
    (Emerald Rapids) the embedded target's layers ran 13-16 rows fastest on ``F.linear``, and its
    49,152 x 576 head took 28.3 ms on ``F.linear`` at 14 rows against 8.1 packed (10.5 against 5.8
    at 4 rows; 5.2 against 5.0 at one row).

    ``why`` says where the plan came from (shown by the bench and the CLI); it does not take part
    in comparisons, so two equal plans share one static-engine cache whatever their origin.
    """

    bands: tuple[tuple[int, str], ...] = ()
    why: str = ""
    head: tuple[tuple[int, str], ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "bands", _checked(self.bands))
        if self.head is not None:
            object.__setattr__(self, "head", _checked(self.head))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LinearPlan) and self.bands == other.bands and self.head == other.head

    def __hash__(self) -> int:
        return hash((self.bands, self.head))

    def kernel(self, rows: int) -> str:
        """The kernel a call of ``rows`` rows takes."""
        for top, kernel in self.bands:
            if rows <= top:
                return kernel
        return "linear"

    def head_plan(self) -> LinearPlan:
        """The plan the LM head's own calls take (:attr:`head`, or the layers' bands)."""
        return LinearPlan(self.bands if self.head is None else self.head, self.why)

    @property
    def active(self) -> bool:
        """Whether any row count leaves ``F.linear`` (else the plan changes nothing)."""
        return any(k != "linear" for _, k in self.bands + (self.head or ()))

    @property
    def max_rows(self) -> int:
        """The largest row count a kernel other than ``F.linear`` may take."""
        return max((r for r, k in self.bands if k != "linear"), default=0)

    @property
    def packs(self) -> bool:
        """Whether any row count takes packed weights (which then need their packed copies)."""
        return any(k == "packed" for _, k in self.bands + (self.head or ()))

    def without_packing(self) -> LinearPlan:
        """The plan for a model whose weights may not be packed: oneDNN on the weights in place
        where it said packed (the nearest kernel without a copy; row-major where oneDNN does not
        take the model's dtype)."""
        def unpacked(bands: tuple[tuple[int, str], ...]) -> tuple[tuple[int, str], ...]:
            return tuple((r, "onednn" if k == "packed" else k) for r, k in bands)

        return LinearPlan(unpacked(self.bands), self.why, None if self.head is None else unpacked(self.head))

    def describe(self) -> str:
        """One line: ``1-3 rows F.linear, 4-64 packed`` (the LM head's own after a semicolon where
        it differs; and where it came from)."""
        text = _described(self.bands)
        if self.head is not None and self.head != self.bands:
            text += f"; LM head: {_described(self.head)}"
        return f"{text} ({self.why})" if self.why else text

    def to_json(self) -> dict[str, Any]:
        head = {} if self.head is None else {"head": [list(b) for b in self.head]}
        return {"bands": [list(b) for b in self.bands], **head, "why": self.why}

    def kernels(self) -> dict[str, Any]:
        """What the plan computes with: :meth:`to_json` without ``why`` (part of the cost profiles'
        key: a profile timed under other kernels, the head's included, is not this plan's)."""
        return {k: v for k, v in self.to_json().items() if k != "why"}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LinearPlan:
        head = data.get("head")
        return cls(tuple((int(r), str(k)) for r, k in data["bands"]), str(data.get("why", "")),
                   None if head is None else tuple((int(r), str(k)) for r, k in head))


def _checked(bands: Any) -> tuple[tuple[int, str], ...]:
    """``bands`` as ascending ``(max_rows, kernel)`` pairs, merged; a ValueError if they are not."""
    out = tuple((int(r), str(k)) for r, k in bands)
    if any(k not in KERNELS for _, k in out) or any(r < 1 for r, _ in out) \
            or any(a[0] >= b[0] for a, b in zip(out, out[1:])):
        raise ValueError(f"bands must be ascending (max_rows >= 1, kernel in {KERNELS}), got {bands!r}")
    return _merged(out)


def _described(bands: tuple[tuple[int, str], ...]) -> str:
    parts, low = [], 1
    for top, kernel in bands:
        parts.append(f"{low}-{top} rows {'F.linear' if kernel == 'linear' else kernel}" if top > low
                     else f"{low} row{'s' if low > 1 else ''} {'F.linear' if kernel == 'linear' else kernel}")
        low = top + 1
    return ", ".join(parts) + (", then F.linear" if parts else "F.linear at every row count")


def _merged(bands: tuple[tuple[int, str], ...]) -> tuple[tuple[int, str], ...]:
    """Adjacent bands of one kernel as one; trailing ``F.linear`` bands dropped (the default past the end)."""
    out: list[tuple[int, str]] = []
    for top, kernel in bands:
        if out and out[-1][1] == kernel:
            out[-1] = (top, kernel)
        else:
            out.append((top, kernel))
    while out and out[-1][1] == "linear":
        out.pop()
    return tuple(out)


def fixed_plan() -> LinearPlan:
    """The layout as tuned on the 2-core EPYC (``cpu_linear=True``): row-major for 1-3 rows, packed
    weights from ``CPU_PACKED_MIN_ROWS`` (4) to ``CPU_LINEAR_MAX_ROWS`` (64)."""
    from dynatree import tuning

    return LinearPlan(((tuning.CPU_PACKED_MIN_ROWS - 1, "rowmajor"), (tuning.CPU_LINEAR_MAX_ROWS, "packed")),
                      "cpu_linear=True: the layout tuned on a 2-core AMD EPYC")


__all__ = ["CacheOptions", "EngineOptions", "LinearPlan", "StoppingConfig", "fixed_plan", "parse_buckets"]


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
