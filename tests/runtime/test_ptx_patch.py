"""ptx_patch: marked inline-asm comments become instructions of an sm_90a target, or a named error."""

from __future__ import annotations

import numpy as np
import pytest

from netcl.runtime import ptx_patch
from netcl.runtime.cache import program_cache
from netcl.runtime.errors import CompileError

PTX = """.version 9.0
.target sm_90, texmode_independent
.address_size 64
.entry k()
{
\t// begin inline asm
\t// NETCL_PTX wgmma.fence.sync.aligned;
\t// end inline asm
\tret;
}
"""


def test_marks_become_instructions_of_sm_90a():
    out = ptx_patch.patch(PTX)
    assert ".target sm_90a, texmode_independent" in out
    assert "\twgmma.fence.sync.aligned;" in out.splitlines()
    assert ptx_patch.MARK not in out
    assert out.replace("sm_90a", "sm_90").replace("wgmma", ptx_patch.MARK + "wgmma") == PTX


def test_tensormap_instructions_raise_the_ptx_version_to_8_3():
    """``tensormap.replace`` and its proxy fence exist from PTX 8.3: an older version is raised to it, a newer
    one (and PTX without them) is kept."""
    fence = "fence.proxy.tensormap::generic.release.gpu"
    old = PTX.replace(".version 9.0", ".version 8.0").replace("wgmma.fence.sync.aligned", fence)
    assert ptx_patch.patch(old).startswith(".version 8.3\n")
    assert ptx_patch.patch(old.replace(".version 8.0", ".version 8.5")).startswith(".version 8.5\n")
    assert ptx_patch.patch(PTX.replace(".version 9.0", ".version 8.0")).startswith(".version 8.0\n")


def test_other_targets_and_unmarked_ptx_are_refused():
    with pytest.raises(ValueError, match=r"target sm_80; sm_90 expected"):
        ptx_patch.patch(PTX.replace("sm_90", "sm_80"))
    with pytest.raises(ValueError, match="no marked instruction"):
        ptx_patch.patch(PTX.replace(ptx_patch.MARK, "// "))
    assert ptx_patch.needed('asm volatile("// NETCL_PTX membar.cta;");')
    assert not ptx_patch.needed('asm volatile("membar.cta;");')


def test_a_marked_kernel_builds_only_where_the_patch_applies(cl_device):
    """On a Hopper GPU the marked instruction runs (the kernel still writes its value); elsewhere the
    build fails with a CompileError (PoCL refuses the inline asm itself; an NVIDIA GPU before Hopper
    gets the patch's "sm_90 expected"), and nothing is cached."""
    import pyopencl as cl

    source = '__kernel void k(__global float* x) { asm volatile("// NETCL_PTX membar.cta;" ::: "memory"); x[0] = 3; }'
    key = ("test_ptx_patch", cl_device.cl_device.name)
    nvidia = "NVIDIA" in cl_device.platform_name.upper()
    try:
        handle = program_cache.get_or_compile(key, source, cl_device.context)
    except CompileError as exc:
        assert not nvidia or "sm_90 expected" in str(exc)
        assert "PTX patch failed" in str(exc) or "build failed" in str(exc)
        assert program_cache.evict(key) == 0
        return
    assert nvidia, "a marked kernel built from a program whose binary is not PTX"
    out = np.zeros(1, np.float32)
    buf = cl.Buffer(cl_device.context, cl.mem_flags.COPY_HOST_PTR, hostbuf=out)
    handle.kernel("k")(cl_device.queue, (1,), None, buf)
    cl.enqueue_copy(cl_device.queue, out, buf)
    assert out[0] == 3
