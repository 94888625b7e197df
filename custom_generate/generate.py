"""dynatree as a transformers ``custom_generate`` folder.

    model.generate(ids, assistant_model=draft, custom_generate="path/to/dynatree", trust_remote_code=True,
                   strategy="dynatree", max_new_tokens=128)

transformers loads this file and calls its ``generate`` with every argument of ``model.generate``;
the implementation lives in the installed package (``pip install dynatree``), so this folder and
``custom_generate=dynatree.hf.generate`` behave the same.
"""

from dynatree.hf import generate

__all__ = ["generate"]
