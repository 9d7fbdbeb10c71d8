"""One index-width rule (``_common.index_ctype``): every kernel family's helper routes to it, each with its
own headroom below 2**31, and switches to ``long`` exactly where it did before (the boundaries below)."""

from __future__ import annotations

import pytest

from netcl.jit import detection_loss, opencl_source, row_source
from netcl.runtime.ops import _common, _grid
from netcl.runtime.ops._common import INDEX_HEADROOM, MAX_LOCAL, index_ctype, index_type

LIMIT = 2**31


def test_layer_kernels_use_the_one_helper():
    assert _grid.index_ctype is _common.index_ctype


@pytest.mark.parametrize("headroom", [0, 1, INDEX_HEADROOM, 2**24])
def test_index_ctype_switches_at_its_headroom(headroom):
    assert index_ctype(LIMIT - headroom - 1, headroom=headroom) == "int"
    assert index_ctype(LIMIT - headroom, headroom=headroom) == "long"
    assert index_ctype(3, -(LIMIT - headroom), headroom=headroom) == "long"  # a negative offset counts too
    assert index_ctype(headroom=headroom) == "int"


def test_default_headroom_is_the_layer_kernels_1024():
    assert index_ctype(LIMIT - 1025) == "int"
    assert index_ctype(LIMIT - 1024) == "long"


def test_shape_helper_keeps_one_work_group_of_headroom():
    assert index_type((LIMIT - MAX_LOCAL - 1,)) == "int"
    assert index_type((LIMIT - MAX_LOCAL,)) == "long"
    assert index_type((2, 3), (2**16, 2**15 - MAX_LOCAL // 2**16 - 1)) == "int"
    assert index_type((0, 2**40)) == "int"  # no elements


def test_jit_row_kernels_switch_at_2_31_elements_or_2_30_rows():
    assert not row_source.needs_long(2**16, 2**15 - 1)
    assert row_source.needs_long(2**16, 2**15)
    assert not row_source.needs_long(2**30 - 1, 1)
    assert row_source.needs_long(2**30, 1)


def test_detection_loss_keeps_2_24_of_headroom():
    assert detection_loss.index_ctype(LIMIT - 2**24 - 1) == "int"
    assert detection_loss.index_ctype(LIMIT - 2**24) == "long"


def test_fused_elementwise_counts_the_padded_grid():
    pad = opencl_source.MAX_LOCAL_SIZE
    assert not opencl_source.needs_long_index((LIMIT - pad - 1,), [(1,)])
    assert opencl_source.needs_long_index((LIMIT - pad,), [(1,)])
    assert opencl_source.needs_long_index((4,), [(LIMIT,), None, ()])  # an input of 2**31 elements
    assert not opencl_source.needs_long_index((4,), [(LIMIT - 1,), None, ()])
