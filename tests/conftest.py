"""Test-session setup that must happen before torch/triton are imported anywhere."""

import os

# Tests run on CPU: the Triton kernel is checked with Triton's interpreter. Triton reads this
# variable when it is first imported (transformers may import it early), so set it here.
os.environ.setdefault("TRITON_INTERPRET", "1")
