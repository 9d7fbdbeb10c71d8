"""One time step of an LSTM or a GRU in one kernel, and its gradient in one kernel (``netcl.nn.recurrent``'s cells).

The products stay outside: a cell takes this step's input projection ``xg`` (``x W_ih^T + b_ih``, (N, G H)) and the
hidden projection ``hg`` (``h W_hh^T + b_hh``, (N, G H), or None for a zero state without bias), gate blocks in
torch's order (LSTM ``i, f, g, o``; GRU ``r, z, n``), and computes torch's update for each (row, unit) in one
work-item. An LSTM's state is one (2, N, H) tensor ``hc`` (``h`` then ``c``: ``hc[0]`` is a view, so the next
product reads ``h`` without a copy). The backward kernels recompute the gates from ``xg`` and ``hg`` (nothing but
the inputs is kept) and write the gradient of the gate pre-activations: for an LSTM one (N, 4H) tensor that is both
``xg``'s and ``hg``'s gradient, for a GRU ``xg``'s and ``hg``'s (they differ in the new gate, where ``hg`` is scaled
by ``r``). Float16 and float64
storage compute as the elementwise ops do (``compute_ctype``). Each kernel has a NumPy twin.
"""

from __future__ import annotations

import numpy as np

from netcl.core import Tensor
from netcl.runtime.ops._common import compute_ctype, pragmas, storage_ctype
from netcl.runtime.ops._grid import run_1d
from netcl.runtime.ops.backend import backend_op

_TWINS = "netcl.runtime.numpy_twins.recurrent_cells"

_HEAD = """{pragmas}
#define SIG(x) {sig}(x)
"""

_LSTM = """__kernel void netcl_lstm_cell(__global const {st}* xg, __global const {st}* hg, __global const {st}* hc,
                              __global {st}* hc_out, const long rows, const long H) {{
    const long gid = get_global_id(0);
    if (gid >= rows * H) return;
    const long n = gid / H, base = n * 4 * H + (gid - n * H);
    const {ct} i = SIG({pre0}), f = SIG({pre1}), g = tanh({pre2}), o = SIG({pre3});
    const {ct} cn = {cell};
    hc_out[rows * H + gid] = ({st})cn;
    hc_out[gid] = ({st})(o * tanh(cn));
}}
"""

_LSTM_BACKWARD = """__kernel void netcl_lstm_cell_backward(__global const {st}* xg, __global const {st}* hg,
                                       __global const {st}* hc, __global const {st}* hc_new,
                                       __global const {st}* dhc, __global {st}* dgates, __global {st}* dhc_prev,
                                       const long rows, const long H) {{
    const long gid = get_global_id(0);
    if (gid >= rows * H) return;
    const long n = gid / H, base = n * 4 * H + (gid - n * H);
    const {ct} i = SIG({pre0}), f = SIG({pre1}), g = tanh({pre2}), o = SIG({pre3});
    const {ct} tc = tanh(({ct})hc_new[rows * H + gid]);
    const {ct} d_h = ({ct})dhc[gid], dct = ({ct})dhc[rows * H + gid] + d_h * o * (1 - tc * tc);
    dgates[base] = ({st})(dct * g * i * (1 - i));
    dgates[base + H] = ({st})({dcf} * f * (1 - f));
    dgates[base + 2 * H] = ({st})(dct * i * (1 - g * g));
    dgates[base + 3 * H] = ({st})(d_h * tc * o * (1 - o));
    dhc_prev[gid] = ({st})0;
    dhc_prev[rows * H + gid] = ({st})(dct * f);
}}
"""

_GRU = """__kernel void netcl_gru_cell(__global const {st}* xg, __global const {st}* hg, __global const {st}* h,
                             __global {st}* h_out, const long rows, const long H) {{
    const long gid = get_global_id(0);
    if (gid >= rows * H) return;
    const long n = gid / H, base = n * 3 * H + (gid - n * H);
    const {ct} r = SIG({pre0}), z = SIG({pre1});
    const {ct} nn = tanh(({ct})xg[base + 2 * H]{reset});
    h_out[gid] = ({st})({update});
}}
"""

_GRU_BACKWARD = """__kernel void netcl_gru_cell_backward(__global const {st}* xg, __global const {st}* hg,
                                      __global const {st}* h, __global const {st}* dh_new, __global {st}* dxg,
                                      __global {st}* dhg, __global {st}* dh_prev, const long rows, const long H) {{
    const long gid = get_global_id(0);
    if (gid >= rows * H) return;
    const long n = gid / H, base = n * 3 * H + (gid - n * H);
    const {ct} r = SIG({pre0}), z = SIG({pre1});
    const {ct} hn = {hn};
    const {ct} nn = tanh(({ct})xg[base + 2 * H] + r * hn);
    const {ct} d = ({ct})dh_new[gid], dpre_n = d * (1 - z) * (1 - nn * nn);
    const {ct} dpre_z = d * ({h} - nn) * z * (1 - z), dpre_r = dpre_n * hn * r * (1 - r);
    dxg[base] = ({st})dpre_r;
    dxg[base + H] = ({st})dpre_z;
    dxg[base + 2 * H] = ({st})dpre_n;
    dhg[base] = ({st})dpre_r;
    dhg[base + H] = ({st})dpre_z;
    dhg[base + 2 * H] = ({st})(dpre_n * r);
    dh_prev[gid] = ({st})(d * z);
}}
"""


def _types(x: Tensor) -> dict[str, str]:
    ct = compute_ctype(x.dtype)
    return {
        "st": storage_ctype(x.dtype),
        "ct": ct,
        "pragmas": pragmas([x.dtype]),
        "sig": "SIGMOID_F64" if ct == "double" else "SIGMOID",
    }


def _pre(types: dict[str, str], k: int, has_h: bool) -> str:
    """The pre-activation of gate block ``k`` at this work-item."""
    x = f"({types['ct']})xg[base + {k} * H]"
    return f"({x} + ({types['ct']})hg[base + {k} * H])" if has_h else x


def _gates(types: dict[str, str], count: int, has_h: bool) -> dict[str, str]:
    return {f"pre{k}": _pre(types, k, has_h) for k in range(count)}


@backend_op(_TWINS)
def lstm_cell(xg: Tensor, hg: Tensor | None, hc: Tensor | None) -> Tensor:
    """torch's LSTM step: the new state (2, N, H) (``h'``, ``c'``) from the gate projections ``xg`` and ``hg``
    (N, 4H) and the state ``hc`` (2, N, H); None for ``hg`` or ``hc`` is zeros."""
    rows, H = xg.shape[0], xg.shape[1] // 4
    types = _types(xg)
    has_h, has_c = hg is not None, hc is not None
    out = Tensor.empty((2, rows, H), xg.dtype, xg.device)
    cell = f"f * ({types['ct']})hc[rows * H + gid] + i * g" if has_c else "i * g"

    def source() -> str:
        return _HEAD.format(**types) + _LSTM.format(cell=cell, **_gates(types, 4, has_h), **types)

    run_1d(("lstm_cell", types["st"], has_h, has_c), xg.device, source, "netcl_lstm_cell",
           [None] * 4 + [np.int64, np.int64], rows * H, xg, hg if has_h else xg, hc if has_c else out, out,
           np.int64(rows), np.int64(H))  # fmt: skip
    return out


@backend_op(_TWINS)
def lstm_cell_backward(
    xg: Tensor, hg: Tensor | None, hc: Tensor | None, hc_new: Tensor, dhc: Tensor
) -> tuple[Tensor, Tensor]:
    """The gradients of ``lstm_cell`` for upstream ``dhc`` (2, N, H): the gate pre-activations' (N, 4H), which is
    both ``xg``'s and ``hg``'s, and ``hc``'s (2, N, H; its ``h`` half zero: the state's ``h`` reaches the step
    through ``hg`` only)."""
    rows, H = xg.shape[0], xg.shape[1] // 4
    types = _types(xg)
    has_h, has_c = hg is not None, hc is not None
    dgates = Tensor.empty(xg.shape, xg.dtype, xg.device)
    dhc_prev = Tensor.empty((2, rows, H), xg.dtype, xg.device)
    dcf = f"dct * ({types['ct']})hc[rows * H + gid]" if has_c else "0"

    def source() -> str:
        return _HEAD.format(**types) + _LSTM_BACKWARD.format(dcf=dcf, **_gates(types, 4, has_h), **types)

    run_1d(("lstm_cell_backward", types["st"], has_h, has_c), xg.device, source, "netcl_lstm_cell_backward",
           [None] * 7 + [np.int64, np.int64], rows * H, xg, hg if has_h else xg, hc if has_c else hc_new, hc_new,
           dhc, dgates, dhc_prev, np.int64(rows), np.int64(H))  # fmt: skip
    return dgates, dhc_prev


@backend_op(_TWINS)
def gru_cell(xg: Tensor, hg: Tensor | None, h: Tensor | None) -> Tensor:
    """torch's GRU step: h' from the projections ``xg`` and ``hg`` (N, 3H) and the state ``h`` (N, H); None for
    ``hg`` or ``h`` is zeros."""
    rows, H = xg.shape[0], xg.shape[1] // 3
    types = _types(xg)
    ct = types["ct"]
    has_hg, has_h = hg is not None, h is not None
    out = Tensor.empty((rows, H), xg.dtype, xg.device)
    fields = {
        "reset": f" + r * ({ct})hg[base + 2 * H]" if has_hg else "",
        "update": f"nn + z * (({ct})h[gid] - nn)" if has_h else "nn - z * nn",
    }

    def source() -> str:
        gates = {f"pre{k}": _pre(types, k, has_hg) for k in range(2)}
        return _HEAD.format(**types) + _GRU.format(**fields, **gates, **types)

    run_1d(("gru_cell", types["st"], has_hg, has_h), xg.device, source, "netcl_gru_cell",
           [None] * 4 + [np.int64, np.int64], rows * H, xg, hg if has_hg else xg, h if has_h else out, out,
           np.int64(rows), np.int64(H))  # fmt: skip
    return out


@backend_op(_TWINS)
def gru_cell_backward(xg: Tensor, hg: Tensor | None, h: Tensor | None, dh_new: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The gradients of ``gru_cell`` for upstream ``dh_new``: ``xg``'s and ``hg``'s (N, 3H) and ``h``'s (N, H)."""
    rows, H = xg.shape[0], xg.shape[1] // 3
    types = _types(xg)
    ct = types["ct"]
    has_hg, has_h = hg is not None, h is not None
    dxg, dhg = (Tensor.empty(xg.shape, xg.dtype, xg.device) for _ in range(2))
    dh_prev = Tensor.empty((rows, H), xg.dtype, xg.device)
    fields = {"hn": f"({ct})hg[base + 2 * H]" if has_hg else "0", "h": f"({ct})h[gid]" if has_h else "0"}

    def source() -> str:
        gates = {f"pre{k}": _pre(types, k, has_hg) for k in range(2)}
        return _HEAD.format(**types) + _GRU_BACKWARD.format(**fields, **gates, **types)

    run_1d(("gru_cell_backward", types["st"], has_hg, has_h), xg.device, source, "netcl_gru_cell_backward",
           [None] * 7 + [np.int64, np.int64], rows * H, xg, hg if has_hg else xg, h if has_h else dh_new, dh_new,
           dxg, dhg, dh_prev, np.int64(rows), np.int64(H))  # fmt: skip
    return dxg, dhg, dh_prev


__all__ = ["gru_cell", "gru_cell_backward", "lstm_cell", "lstm_cell_backward"]
