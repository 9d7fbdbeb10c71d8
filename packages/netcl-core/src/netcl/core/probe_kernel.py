"""The chain8 probe kernel the device probes build (``engine_choice`` times it, ``vector_width``
checks it): the body written as netcl.jit writes fused kernels for CPU devices, on ``float{width}``."""

from __future__ import annotations

from netcl.core.kernels import PRIMITIVE_PREAMBLE
from netcl.core.kernels.vector_primitives import vector_preamble

PROBE_SOURCE = r"""
__kernel void probe_chain8(__global const float* restrict x, __global const float* restrict a,
                           __global const float* restrict b, __global float* restrict out, const int n) {
    int v = get_global_id(0);
    if ((v + 1) * @W@ > n) return;
    VF xi = vload@W@(v, x);
    VF h = ADD(MUL(xi, vload@W@(v, a)), vload@W@(v, b));
    h = MUL(V_RELU(h), 0.5f);
    h = V_TANH(SUB(V_SIGMOID(h), xi));
    vstore@W@(MUL(h, h), v, out);
}
"""


def probe_kernel_source(width: int) -> str:
    """The chain8 probe as netcl.jit writes fused kernels for CPU devices: the body on ``float{width}``."""
    return PRIMITIVE_PREAMBLE + vector_preamble(width) + PROBE_SOURCE.replace("@W@", str(width))
