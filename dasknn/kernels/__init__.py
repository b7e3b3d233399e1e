"""Numba kernels that run on one chunk: one module per family of kernels.

Import from the submodules (``dasknn.kernels.training``, ``dasknn.kernels.inference``).
"""
