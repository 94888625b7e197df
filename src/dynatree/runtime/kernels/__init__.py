"""Kernels: Triton block-sparse tree attention (optional, GPU; SDPA is the reference path) and the
few-row linear layout used on CPU (cpu_linear.py). Everything works without the Triton one."""
