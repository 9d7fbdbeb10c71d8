"""The reference workloads of docs/architecture.md, as netcl functions and float64 NumPy references.

Tests and benchmarks use these names. Each netcl version is a plain function of autograd ops
(un-fused when called directly; wrap it in ``jit_compile`` to fuse).
"""

from __future__ import annotations

import numpy as np

from netcl.autograd import ops


def chain8(x, a, b):
    """Eight elementwise ops; 3 inputs, 1 output (16 bytes per element when fused)."""
    h = x * a
    h = h + b
    h = ops.relu(h)
    h = h * 0.5
    h = ops.sigmoid(h)
    h = h - x
    h = ops.tanh(h)
    return h * h


def bias_gelu(x, b):
    """``gelu(x + b)`` with x ``(B, F)`` and b ``(1, F)``."""
    return ops.gelu(x + b)


def mlp_block(x, w, b):
    """``relu(x @ w + b) + 1.0``: a matmul, then an epilogue that fuses into one kernel."""
    return ops.relu(ops.matmul(x, w) + b) + 1.0


# ---- float64 NumPy references --------------------------------------------------------------
def _sigmoid(v: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * v))


def _gelu(v: np.ndarray) -> np.ndarray:
    return 0.5 * v * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (v + 0.044715 * v**3)))


def chain8_reference(x: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    h = np.maximum(x * a + b, 0.0) * 0.5
    return np.tanh(_sigmoid(h) - x) ** 2


def bias_gelu_reference(x: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _gelu(x + b)


def mlp_block_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.maximum(x @ w + b, 0.0) + 1.0
