"""NumPy twins of ``netcl.runtime.ops.conv_winograd``: the same transforms on NumPy arrays, the same
batched product through the runtime's ``matmul`` (the host BLAS on the backend's threads).

Each transform is the kernels' straight-line code vectorized over every tile and channel at once:
the (i, j) element of a patch is a strided slice of the (zero-padded) image, and ``left @ block @
right^T`` is two passes of linear combinations of such slices (zero coefficients skipped, +-1 an
add or a subtract), written straight into the product's operand layout. float32 throughout, so its
rounding is of the same kind as the kernels' (sums of a few terms), not bit for bit theirs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np

from netcl.core import Tensor
from netcl.core.dtypes import float32
from netcl.runtime.ops._common import wrap_numpy
from netcl.runtime.ops.conv_winograd_tiling import MATRICES, TileGrid
from netcl.runtime.ops.linalg import matmul


def _matrices(tiling: TileGrid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(B^T, G, A^T) of the tiling's F(m x m, 3 x 3) as float32 arrays (shared: read only)."""
    return _float32_matrices(tiling.m)


@functools.cache
def _float32_matrices(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    arrays = tuple(np.array([[float(c) for c in row] for row in matrix], np.float32) for matrix in MATRICES[m])
    for array in arrays:
        array.flags.writeable = False
    return arrays


def _combine(coeffs: Sequence[np.float32], arrays: Sequence[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
    """sum(coefficient * array) in float32, zero coefficients left out, into ``out`` when given."""
    terms = [(c, a) for c, a in zip(coeffs, arrays, strict=True) if c != 0]
    acc = np.empty_like(arrays[0]) if out is None else out
    if not terms:
        acc.fill(0.0)
        return acc
    (c, a), rest = terms[0], terms[1:]
    if c == 1:
        np.copyto(acc, a)
    else:
        np.multiply(a, c, out=acc)
    for c, a in rest:
        if c == 1:
            np.add(acc, a, out=acc)
        elif c == -1:
            np.subtract(acc, a, out=acc)
        else:
            acc += a * c
    return acc


def _sandwich(left: np.ndarray, block: Callable[[int, int], np.ndarray], right: np.ndarray, out) -> None:
    """``out(i, j)[...] = (left @ B @ right^T)[i, j]`` where ``block(k, q)`` is element (k, q) of
    every B at once: ``left`` times the block into temporaries, then ``right`` (as the kernels do)."""
    inner, cols = left.shape[1], right.shape[1]
    temps = {
        (i, q): _combine(left[i], [block(k, q) for k in range(inner)]) for i in range(len(left)) for q in range(cols)
    }
    for i in range(len(left)):
        for j in range(len(right)):
            _combine(right[j], [temps[i, q] for q in range(cols)], out(i, j))


def _transform_blocks(src: np.ndarray, tiling: TileGrid, left: np.ndarray, pads: tuple[int, int]) -> np.ndarray:
    """(a^2, S, P) with a = len(left): ``left @ D @ left^T`` of each tile's block D of ``src`` (N, S, H, W)
    zero-padded by ``pads`` (and zero past its end): the input patches' transform (B^T, (m + 2)^2 blocks) and the
    upstream gradient blocks' (A, m x m). P is ordered (th, tw, n), the image innermost: every tap ``block(k, q)``
    is then a strided view whose rows are whole batches, so each of the transform's passes runs over long
    contiguous rows (the kernels' order (n, th, tw) leaves runs of th or tw elements, see benchmarks/RESULTS.md,
    "The NumPy backend's Winograd twin")."""
    a, inner = left.shape
    m, th, tw = tiling.m, tiling.th, tiling.tw
    n, s, h, width = src.shape
    padded = np.zeros((s, m * th + inner - m, m * tw + inner - m, n), np.float32)
    keep_h, keep_w = min(h, padded.shape[1] - pads[0]), min(width, padded.shape[2] - pads[1])
    images = src[:, :, :keep_h, :keep_w].transpose(1, 2, 3, 0)  # (S, H, W, N)
    padded[:, pads[0] : pads[0] + keep_h, pads[1] : pads[1] + keep_w] = images
    out = np.empty((a * a, s, th, tw, n), np.float32)
    _sandwich(left, lambda k, q: padded[:, k : k + m * th : m, q : q + m * tw : m], left, lambda i, j: out[i * a + j])
    return out.reshape(a * a, s, tiling.count)


def _transform_input(src: np.ndarray, tiling: TileGrid, pads: tuple[int, int]) -> np.ndarray:
    """V (a2, S, P) of ``src`` (N, S, H, W): each tile's (m + 2)^2 patch under B^T."""
    return _transform_blocks(src, tiling, _matrices(tiling)[0], pads)


def _filters(filters: np.ndarray, g: np.ndarray) -> np.ndarray:
    """U (a2, R, S) = G g G^T of each of the R x S 3x3 filters."""
    a = len(g)
    u = np.einsum("ik,rskl,jl->ijrs", g, filters, g, optimize=True)  # two contractions, not one six-index loop
    return u.astype(np.float32).reshape(a * a, *filters.shape[:2])


def convolve(
    src: Tensor, w: Tensor, flip: bool, pads: tuple[int, int], extra: Tensor | None, kind: str, tiling: TileGrid
) -> Tensor:
    """``conv_winograd.convolve`` on the NumPy backend."""
    _, g, at = _matrices(tiling)
    a, m, n = tiling.m + 2, tiling.m, src.shape[0]
    filters = np.asarray(w.data, np.float32)
    if flip:  # w (S, R, 3, 3) read as w'[r, s] = w[s, r, ::-1, ::-1]
        filters = filters[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)
    r = filters.shape[0]
    v = _transform_input(np.asarray(src.data, np.float32), tiling, pads)
    u = _filters(filters, g)
    prod = np.asarray(matmul(wrap_numpy(u, src.device), wrap_numpy(v, src.device)).data)  # (a2, R, P)
    blocks = prod.reshape(a * a, r, tiling.th, tiling.tw, n)  # P ordered as ``_transform_blocks`` orders it
    y = np.empty((m, m, r, tiling.th, tiling.tw, n), np.float32)  # phases of the output
    _sandwich(at, lambda k, q: blocks[k * a + q], at, lambda i, j: y[i, j])
    y = y.transpose(5, 2, 3, 0, 4, 1).reshape(n, r, m * tiling.th, m * tiling.tw)
    out = np.ascontiguousarray(y[:, :, : tiling.oh, : tiling.ow])
    if kind == "bias":
        out += np.asarray(extra.data, np.float32).reshape(1, r, 1, 1)
    elif kind == "addend":
        out = np.asarray(extra.data, np.float32) + out
    return wrap_numpy(out, src.device, float32)


def weight_grad(grad: Tensor, x: Tensor, geo, addend: Tensor | None, tiling: TileGrid) -> Tensor:
    """``conv_winograd.weight_grad`` (``backward_weight``) on the NumPy backend."""
    pads = (geo.PH, geo.PW)
    _, g, at = _matrices(tiling)
    a = tiling.m + 2
    dy = np.asarray(grad.data, np.float32)
    o = dy.shape[1]
    v = _transform_input(np.asarray(x.data, np.float32), tiling, pads)
    dm = _transform_blocks(dy, tiling, at.T, (0, 0))  # the m x m blocks, zero past the output's edges
    device = x.device
    du = np.asarray(matmul(wrap_numpy(dm, device), wrap_numpy(v, device), transpose_b=True).data)
    dw = np.einsum("ki,klrs,lj->rsij", g, du.reshape(a, a, o, -1), g, optimize=True).astype(np.float32)
    if addend is not None:
        dw = np.asarray(addend.data, np.float32) + dw
    return wrap_numpy(dw, device, float32)
