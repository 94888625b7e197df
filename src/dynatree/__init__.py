"""dynatree: exact tree-based speculative decoding for unmodified HuggingFace causal LMs."""

from .engine import generate, precompile
from .errors import DynaTreeError
from .policies import STRATEGIES, make_policy
from .stats import GenerationResult, GenerationStats, RoundStats

__all__ = [
    "STRATEGIES",
    "DynaTreeError",
    "GenerationResult",
    "GenerationStats",
    "RoundStats",
    "generate",
    "make_policy",
    "precompile",
]
__version__ = "0.1.0"
