"""The tiling of Winograd's F(m x m, 3 x 3), shared by the OpenCL kernels (``conv_winograd``) and the
NumPy backend's twin (``numpy_twins.conv_winograd``): the (B^T, G, A^T) matrices and a layer's grid of
m x m output blocks. Pure data: nothing here builds or launches a kernel.
"""

from __future__ import annotations

from fractions import Fraction

from netcl.runtime.ops._grid import index_ctype

HALF, SIXTH = Fraction(1, 2), Fraction(1, 6)

#: (B^T, G, A^T) of F(m x m, 3 x 3) for output tiles m = 2 (points 0, 1, -1; Lavin & Gray) and m = 4
#: (points 0, 1, -1, 2, -1/2 and infinity, the Toom-Cook construction with B^T scaled to integers):
#: these points round less than Lavin & Gray's 0, +-1, +-2 at the same number of products (see
#: benchmarks/RESULTS.md, "Measurements moved out of source docstrings", conv_winograd.py).
MATRICES = {
    2: (
        [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
        [[1, 0, 0], [HALF, HALF, HALF], [HALF, -HALF, HALF], [0, 0, 1]],
        [[1, 1, 1, 0], [0, 1, -1, -1]],
    ),
    4: (
        [[2, 3, -4, -3, 2, 0], [0, 2, 5, 1, -2, 0], [0, 2, 1, -5, 2, 0],
         [0, 1, 2, -1, -2, 0], [0, 2, -1, -2, 1, 0], [0, 2, 3, -4, -3, 2]],
        [[HALF, 0, 0], [SIXTH, SIXTH, SIXTH], [SIXTH, -SIXTH, SIXTH],
         [Fraction(-1, 30), Fraction(-1, 15), Fraction(-2, 15)], [Fraction(-16, 15), Fraction(8, 15), Fraction(-4, 15)],
         [0, 0, HALF]],
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -HALF, 0], [0, 1, 1, 4, Fraction(1, 4), 0],
         [0, 1, -1, 8, Fraction(-1, 8), 1]],
    ),
}  # fmt: skip


class TileGrid:
    """The m x m output blocks of a layer: ``th`` x ``tw`` per image, ``count`` in all (P), the
    index type every transform of the layer uses and F(m x m, 3 x 3)'s (B^T, G, A^T)."""

    def __init__(self, m: int, n: int, out_hw: tuple[int, int], channels: tuple[int, int], sizes: tuple[int, ...]):
        if m not in MATRICES:
            raise ValueError(f"conv_winograd: tile must be one of {sorted(MATRICES)}, got {m}")
        self.m, self.a2, self.matrices = m, (m + 2) ** 2, MATRICES[m]
        self.oh, self.ow = out_hw
        self.th, self.tw = -(-self.oh // m), -(-self.ow // m)
        self.count = n * self.th * self.tw
        self.idx = index_ctype(*(self.a2 * c * self.count for c in channels), *sizes)
