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
    from dynatree.options import EngineOptions, StoppingConfig
    from dynatree.policies import STRATEGIES, make_policy
    from dynatree.core.stats import GenerationResult, GenerationStats, RoundStats
    from dynatree.core.sampling import SamplingConfig
    from dynatree.core.tree import TokenTree, TreeBuilder
    from dynatree.drafts.suffix import TextDraft
    from dynatree.drafts.suffix_index import SuffixCache
    from dynatree.loop.backoff import Backoff
    from dynatree.policies import DraftPolicy

_LAZY = {
    "generate": "dynatree.loop.generate", "precompile": "dynatree.loop.precompile", "EngineOptions": "dynatree.options",
    "StoppingConfig": "dynatree.options",
    "STRATEGIES": "dynatree.policies", "make_policy": "dynatree.policies", "GenerationResult": "dynatree.core.stats",
    "GenerationStats": "dynatree.core.stats", "RoundStats": "dynatree.core.stats",
    # for policies of one's own ("or a policy object") and for drafting from the text
    "DraftPolicy": "dynatree.policies", "TreeBuilder": "dynatree.core.tree", "TokenTree": "dynatree.core.tree",
    "SamplingConfig": "dynatree.core.sampling", "TextDraft": "dynatree.drafts.suffix",
    "SuffixCache": "dynatree.drafts.suffix_index", "Backoff": "dynatree.loop.backoff",
}

__all__ = [
    "STRATEGIES",
    "Backoff",
    "DraftPolicy",
    "DynaTreeError",
    "EngineOptions",
    "GenerationResult",
    "GenerationStats",
    "RoundStats",
    "SamplingConfig",
    "StoppingConfig",
    "SuffixCache",
    "TextDraft",
    "TokenTree",
    "TreeBuilder",
    "generate",
    "make_policy",
    "precompile",
]
__version__ = "0.2.0"


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
