"""dynatree: exact tree-based speculative decoding for unmodified HuggingFace causal LMs.

The public names are loaded on first use (PEP 562), so ``import dynatree`` -- and with it
``dynatree --help`` -- does not pay for importing torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dynatree.errors import DynaTreeError

if TYPE_CHECKING:
    from dynatree.loop.generate import generate
    from dynatree.loop.precompile import precompile
    from dynatree.options import EngineOptions
    from dynatree.policies import STRATEGIES, make_policy
    from dynatree.core.stats import GenerationResult, GenerationStats, RoundStats

_LAZY = {
    "generate": "dynatree.loop.generate", "precompile": "dynatree.loop.precompile", "EngineOptions": "dynatree.options",
    "STRATEGIES": "dynatree.policies", "make_policy": "dynatree.policies", "GenerationResult": "dynatree.core.stats",
    "GenerationStats": "dynatree.core.stats", "RoundStats": "dynatree.core.stats",
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
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
