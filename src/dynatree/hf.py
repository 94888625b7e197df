"""The stable public path of the HF integration: ``custom_generate=dynatree.hf.generate``.

The code lives in :mod:`dynatree.integrations.hf`; this module only re-exports it, so the one
keyword users add to ``model.generate(...)`` keeps working wherever the package's folders move.
"""

from dynatree.integrations.hf import generate

__all__ = ["generate"]
