"""dynatree: exact tree-based speculative decoding for unmodified HuggingFace causal LMs.

The public names are loaded on first use (PEP 562), so ``import dynatree`` -- and with it
``dynatree --help`` -- does not pay for importing torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import DynaTreeError

if TYPE_CHECKING:
    from .engine import generate
    from .engines import precompile
    from .options import EngineOptions
    from .policies import STRATEGIES, make_policy
    from .stats import GenerationResult, GenerationStats, RoundStats

_LAZY = {
    "generate": "engine", "precompile": "engines", "EngineOptions": "options", "STRATEGIES": "policies", "make_policy": "policies",
    "GenerationResult": "stats", "GenerationStats": "stats", "RoundStats": "stats",
}

__all__ = [
    "STRATEGIES",
    "DynaTreeError",
    "EngineOptions",
    "GenerationResult",
    "GenerationStats",
    "RoundStats",
    "generate",
    "make_policy",
    "precompile",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
