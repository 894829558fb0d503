"""Kernel tests run the Triton kernels in the interpreter on CPU.

TRITON_INTERPRET must be set before ``triton.jit`` decorates the kernels, i.e. before the kernel
modules are imported; tests that launch kernels skip cleanly when Triton is not installed.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
