"""Optional GPU kernels (Triton). Everything works without them; SDPA is the reference path."""
