"""The API reference's runtime paths: graph_fusion.fuse_graph and enable_profiling()."""

from __future__ import annotations

import sys

import pytest

import netcl.runtime as rt


def test_graph_fusion_re_exports_fuse_graph_from_netcl_jit(monkeypatch):
    monkeypatch.delitem(sys.modules, "netcl.runtime.graph_fusion", raising=False)
    import netcl.jit
    from netcl.runtime.graph_fusion import FusedGraph, fuse_graph

    assert fuse_graph is netcl.jit.fuse_graph and FusedGraph is netcl.jit.FusedGraph


def test_graph_fusion_without_netcl_jit_names_the_distribution(monkeypatch):
    monkeypatch.setitem(sys.modules, "netcl.jit", None)
    monkeypatch.delitem(sys.modules, "netcl.runtime.graph_fusion", raising=False)
    with pytest.raises(ImportError, match="'netcl-jit' distribution") as info:
        import netcl.runtime.graph_fusion  # noqa: F401
    assert "pip install ./packages/netcl-jit" in str(info.value)


def test_enable_profiling_reports_whether_events_time_the_queue(device):
    # every netcl OpenCL queue is created with profiling on; the NumPy backend times by wall clock
    assert rt.enable_profiling(device) is (device.kind == "opencl")
