"""Triton kernels, each beside the plain-torch reference it is tested against."""
