"""Kernels: Triton block-sparse tree attention (optional, GPU; SDPA is the reference path) and the
few-row linear layout used on CPU (cpu_linear.py), and grouped-query attention that reads the
KV cache in place on CPU (grouped_kv.py). Everything works without the Triton one."""
