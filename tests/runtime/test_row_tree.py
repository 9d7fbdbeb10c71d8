"""The one local-memory reduction tree of the row kernels (``_rows.tree_loop_c`` / ``tree_reduce_c``).

A kernel built from ``tree_reduce_c`` combines each work-group's values in the tree's fixed pairing
(lane ``i`` takes lane ``i + h`` for h = L/2, ..., 1): its float32 sums equal, bit for bit, a NumPy
replay of that pairing, and its (max, first index) merge the first index of the maximum. Every row
kernel family's source takes its tree from these generators and writes no halving loop of its own;
the softmax family, the norms and the class losses are kernels on the ``_rows`` skeleton (``RowKernel``).
"""

from __future__ import annotations

import numpy as np
import pytest

from netcl.core import Tensor
from netcl.core.dtypes import float32, int32
from netcl.jit import detection_loss_kernels, row_source
from netcl.runtime.launch import launch
from netcl.runtime.ops import _rows, batchnorm, class_loss, clip_kernels, reduce, rowwise
from netcl.runtime.ops._common import get_kernel

_ARGMAX = (
    "if (s0[lid + h] > s0[lid] || (s0[lid + h] == s0[lid] && s1[lid + h] < s1[lid])) {",
    "    s0[lid] = s0[lid + h]; s1[lid] = s1[lid + h];",
    "}",
)

_KERNEL = (
    _rows.tree_reduce_c("tree_sum", "float", _rows.sum_combine())
    + _rows.tree_reduce_c("tree_argmax", ["float", "int"], _ARGMAX)
    + """
__kernel void tree_test(__global const float* x, __global float* sums, __global float* best, __global int* at) {
    __local float sa[256], sb[256];
    __local int si[256];
    const int lid = get_local_id(0), g = get_group_id(0);
    const float v = x[g * get_local_size(0) + lid];
    const float total = tree_sum(v, sa);
    float m = v;
    int i = lid;
    tree_argmax(&m, &i, sb, si);
    if (lid == 0) { sums[g] = total; best[g] = m; at[g] = i; }
}
"""
)


def _tree_order_sum(values: np.ndarray) -> np.float32:
    """The float32 sum in the tree's pairing: slot i += slot i + h, halving h."""
    s = values.astype(np.float32).copy()
    h = len(s) // 2
    while h > 0:
        s[:h] = s[:h] + s[h : 2 * h]
        h //= 2
    return s[0]


@pytest.mark.parametrize("lanes", [1, 2, 16, 128, 256])
def test_tree_reduce_c_combines_in_the_tree_order(cl_device, lanes):
    groups = 5
    rng = np.random.default_rng(lanes)
    x = (rng.standard_normal((groups, lanes)) * 10 ** rng.uniform(-3, 3, (groups, lanes))).astype(np.float32)
    x[1, lanes // 2] = x[1].max() + 1  # a unique maximum
    x[2, :] = 3.0  # all tied: the first index wins
    resolved = get_kernel(("test_row_tree",), cl_device, lambda: _KERNEL, "tree_test", [None] * 4)
    dev_x = Tensor.from_host(cl_device, x.reshape(-1))
    sums, best = (Tensor.empty((groups,), float32, cl_device) for _ in range(2))
    at = Tensor.empty((groups,), int32, cl_device)
    launch(resolved.kernel, groups * lanes, lanes, dev_x, sums, best, at, queue=cl_device.queue)
    expected = np.array([_tree_order_sum(row) for row in x], np.float32)
    assert sums.numpy().tobytes() == expected.tobytes()  # bit for bit: the same pairing
    np.testing.assert_array_equal(best.numpy(), x.max(axis=1))
    np.testing.assert_array_equal(at.numpy(), x.argmax(axis=1))  # the first index of the maximum


def _halving_loops(source: str) -> int:
    return source.count(">>= 1)")


def test_row_kernel_families_take_their_trees_from_rows():
    loop = "for (int h = get_local_size(0) / 2; h > 0; h >>= 1)"
    fmt = {
        "ct": "float",
        "st": "float",
        "load": "((float)(p)[i])",
        "store": "((p)[i] = (float)(v))",
        "idx": "int",
        "storage_helpers": "",
    }
    helpers = rowwise.row_helpers(fmt)  # the NaN-keeping max tree; sums are the skeleton's ROW_SUM
    assert _halving_loops(helpers) == helpers.count(loop) == 1
    for kernel in (*[getattr(rowwise, n) for n in ("_SOFTMAX_FORWARD", "_SOFTMAX_BACKWARD", "_NORM_FORWARD",
                   "_NORM_BACKWARD")], class_loss._FORWARD, class_loss._BACKWARD):  # fmt: skip
        assert isinstance(kernel, rowwise.RowKernel)  # framed by _rows.source
        assert "barrier" not in kernel.body and "__local" not in kernel.body
    header = batchnorm._header([np.dtype(np.float32)], "float", "int", {"VEC": 1})
    assert _halving_loops(header) == header.count(loop) == 1
    assert _halving_loops(_rows._GROUP_HELPERS) == _rows._GROUP_HELPERS.count(loop) == 3
    f32 = np.dtype(np.float32)
    for mode, count in (("tree", 1), ("cols", 1), ("serial", 0)):
        source = reduce._source("sum", mode, f32, ((), (True,)), f32, f32, "int")
        assert _halving_loops(source) == source.count("h > 0; h >>= 1)") == count
    assert "h > 0; h >>= 1)" in _rows.tree_loop_c("", half="L / 2")
    clip = clip_kernels._partial_source(np.dtype(np.float32), "two", 2) + clip_kernels._finish_source("inf")
    assert _halving_loops(clip) == clip.count("h > 0; h >>= 1)") == 2
    detection = detection_loss_kernels.detection_loss_source("int", 256)
    assert _halving_loops(detection) == detection.count("h > 0; h >>= 1)") == 1
    assert row_source.tree_loop_c is _rows.tree_loop_c
