"""Tensor cores through inline PTX: which devices have them (a probe), and running the mma kernel.

A device qualifies when it is an NVIDIA GPU and a probe kernel with ``mma.sync`` of each mode
builds and multiplies a 16 x 8 x 16 product correctly (checked against NumPy once per device
and process). Hopper's ``wgmma`` (tf32, f16 and bf16, through patched PTX: ``netcl.runtime.ptx_patch``)
joins the configs where its own probe passes (tf32 products of untransposed operands: the
swapped kernel, ``MmaConfig.swap``; float32 operands rounded to f16 / bf16 in the kernel: tiles
filled through registers; each with a probe of its own). Every other device, and a device
whose probe fails, keeps the portable kernel; asking for tensor cores there logs one line per
device, never an error. ``NETCL_MMA=0`` turns the path off (to compare with the portable kernel).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from netcl.core import Device, Tensor
from netcl.core.dtypes import bfloat16, float16, float32
from netcl.runtime import cuda_driver, tune
from netcl.runtime.ops._common import get_kernel
from netcl.runtime.ops.gemm_mma_source import (
    ASYNC_MODES,
    PRE_MODES,
    WGMMA_MODES,
    WORD_DTYPE,
    WORD_MODES,
    MmaConfig,
    mma_source,
    tma_box,
)
from netcl.runtime.ops.gemm_plan import (
    ARG_DTYPES,
    Problem,
    finish_plan,
    index_kind,
    split_count,
    split_twins,
    trial_run,
)
from netcl.runtime.ops.gemm_source import IDENTITY, OperandView
from netcl.runtime.ops.gemm_transpose import TransposedPlan, k_major
from netcl.runtime.recording import paused

log = logging.getLogger("netcl.gemm")
_PROBED: dict[tuple[Device, str], bool] = {}
_WARNED: set[Device] = set()
_LOCK = threading.Lock()


def _nvidia(device: Device) -> bool:
    return device.kind == "opencl" and device.is_gpu and "NVIDIA" in device.platform_name.upper()


def mode_for(device: Device, a_dtype: np.dtype, b_dtype: np.dtype, precision: str) -> str | None:
    """ "f16", "bf16", "tf32", "tf32x3", "bf16x3" or None (portable kernel) for operands of these dtypes: f16
    for two float16 tensors, bf16 for two bfloat16 tensors, float32 ones by ``precision``."""
    if a_dtype == float16 and b_dtype == float16:
        mode = "f16"
    elif a_dtype == bfloat16 and b_dtype == bfloat16:  # the words multiply as they are (``_words``)
        mode = "bf16"
    elif a_dtype == float32 and b_dtype == float32 and precision != "highest":
        mode = {"tf32x3": "tf32x3", "bf16x3": "bf16x3", "high": "tf32", "medium": "bf16", "fp16": "f16"}[precision]
    else:
        return None
    if not _switched_on(device):
        return None
    if available(device, mode):
        return mode
    if device not in _WARNED:
        _WARNED.add(device)
        log.warning("netcl: no tensor cores on %s; %s products use the portable kernel", device.cl_device.name, mode)
    return None


def _words(dtype: np.dtype) -> bool:
    """Whether an operand of ``dtype`` is stored in a 16-bit mode's format (float16, bfloat16): its
    words are copied as they are, not converted from float32."""
    return dtype in (float16, bfloat16)


def enabled(device: Device, mode: str) -> bool:
    """Whether products of ``mode`` run on tensor cores on ``device`` (``NETCL_MMA`` and the probe; no log line)."""
    return _switched_on(device) and available(device, mode)


def _switched_on(device: Device) -> bool:
    return device.kind == "opencl" and os.environ.get("NETCL_MMA", "1").strip() != "0"


def available(device: Device, mode: str) -> bool:
    """Whether ``device`` ran the probe of ``mode`` correctly (probed once per process)."""
    return _probe_result(device, mode) is not None


def _once(key: tuple, probe: Callable[[], int | None]) -> int | None:
    """``probe()``'s result for ``key``, run once per process (the builds happen outside the lock)."""
    with _LOCK:
        if key in _PROBED:
            return _PROBED[key]
    result = probe()
    with _LOCK:
        _PROBED[key] = result
    return result


def _probed(key: tuple, device: Device, mode: str, **probe: Any) -> bool:
    """Whether ``_probe(device, mode, **probe)`` passed, run once per process under ``key``."""
    return _once(key, lambda: 1 if _probe(device, mode, **probe) else None) is not None


def _probe_result(device: Device, mode: str) -> int | None:
    """None: no tensor cores for ``mode``; else the ``ldsm`` flag that worked (1: ldmatrix)."""
    if not _nvidia(device):
        return None
    return _once((device, mode), lambda: next((ldsm for ldsm in (1, 0) if _probe(device, mode, ldsm)), None))


def _async_ok(device: Device, mode: str) -> bool:
    """Whether the cp.async pipeline (tf32, f16 and bf16 modes; the 16-bit ones copy stored float16 / bfloat16
    words) builds and multiplies correctly (probed once)."""
    ldsm = _probe_result(device, mode) if mode in ASYNC_MODES else None
    if ldsm is None:
        return False
    return _probed((device, f"{mode}-async"), device, mode, ldsm=ldsm, stages=2)


def wgmma_ok(device: Device, mode: str, converts: bool = False) -> bool:
    """Whether ``wgmma`` kernels of ``mode`` build and multiply correctly (probed once): tf32, f16 and bf16
    operands copied by cp.async, or with ``converts`` float32 operands rounded to f16 / bf16 as
    they pass through registers into local memory (amp's "fp16", "medium")."""
    if mode not in WGMMA_MODES:
        return False
    if mode == "tf32x3":  # TMA stages split in local memory (``gemm_mma_source._x3_main_loop``)
        if converts or not (_async_ok(device, mode) and tma_ok(device, "tf32")):
            return False
        return _probed((device, "tf32x3-wgmma"), device, mode, ldsm=1, cfg=_X3_PROBE)
    if converts:
        if mode in WORD_MODES or not available(device, mode):
            return False
        regs = MmaConfig(4, 1, 1, 2, 8, wg=2)
        return _probed((device, f"{mode}-wgmma-converts"), device, mode, ldsm=1, cfg=regs, operands=float32)
    if not _async_ok(device, mode):
        return False
    cfg = MmaConfig(4, 1, 1, 2, 8, stages=3, wg=1)
    return _probed((device, f"{mode}-wgmma"), device, mode, ldsm=1, cfg=cfg)


def swap_ok(device: Device) -> bool:
    """Whether tf32 ``wgmma`` with B^T's fragments from registers (``MmaConfig.swap``: untransposed
    operands) builds and multiplies correctly (probed once)."""
    if not wgmma_ok(device, "tf32"):
        return False
    cfg = MmaConfig(4, 1, 1, 2, 8, stages=3, wg=2, swap=1)
    return _probed((device, "tf32-wgmma-swap"), device, "tf32", ldsm=1, cfg=cfg)


def _probe(
    device: Device,
    mode: str,
    ldsm: int,
    stages: int = 0,
    cfg: MmaConfig | None = None,
    operands: np.dtype | None = None,
) -> bool:
    """Build the smallest mma kernels of ``mode`` (NN and TT; a tf32 ``wgmma``: NT, swapped: NN) and
    check 16 x 16 x 16 products of ``operands`` (default: the stored words of a 16-bit mode - float16,
    bfloat16 - else float32)."""
    from netcl.runtime.errors import CompileError, LaunchError

    rng = np.random.default_rng(7)
    dtype = operands or WORD_DTYPE.get(mode, float32)
    cfg = cfg or MmaConfig(1, 1, 1, 2, 16 if mode == "bf16x3" else 8, 1, 1, ldsm, stages)  # (bf16x3: k16 a step)
    layouts = [(False, False), (True, True)]
    if cfg.wg and mode == "tf32":  # tf32 wgmma: NT, or NN swapped
        layouts = [(False, not cfg.swap)]
    elif cfg.wg and mode == "tf32x3":  # every layout: M/N-major tiles split into K-major ones
        layouts = [(False, True), (False, False), (True, False), (True, True)]
    # tf32 / bf16 / fp16 operand rounding: relative 2**-11 / 2**-8 / 2**-11 per product, 16 products
    # of |x| <= 1, plus fp32 accumulation; tf32x3: about 2**-21 per product (a plain tf32 result fails); bf16x3:
    # at most 3 * 2**-16 per product, 7.3e-4 in all (a plain bf16 result fails)
    tol = {"f16": 1e-2, "tf32": 2e-2, "bf16": 1.5e-1, "tf32x3": 1e-5, "bf16x3": 1e-3}[mode]
    for trans_a, trans_b in layouts:
        a = rng.uniform(-1, 1, (16, 16)).astype(dtype)
        b = rng.uniform(-1, 1, (16, 16)).astype(dtype)
        try:  # one-time setup, also when the first product of a mode runs inside a capture: not recorded
            with paused(device.queue):
                ta, tb = Tensor.from_host(device, a), Tensor.from_host(device, b)
                problem = Problem(16, 16, 16, trans_a, trans_b, ())
                plan = make_plan(device, mode, ta.dtype, tb.dtype, float32, (16, 16), problem, cfg=cfg)
                got = plan.run(ta, tb).to_host()
        except (CompileError, LaunchError, cuda_driver.CudaError) as exc:
            log.info(
                "netcl: tensor-core probe (%s, %s) failed on %s: %s", mode, cfg.short(), device.cl_device.name, exc
            )
            return False
        x, y = (a.T if trans_a else a), (b.T if trans_b else b)
        expected = x.astype(np.float64) @ y.astype(np.float64)
        if not np.all(np.abs(got - expected) <= tol):
            log.warning(
                "netcl: tensor-core probe (%s, %s) on %s gave wrong results", mode, cfg.short(), device.cl_device.name
            )
            return False
    return True


#: The deep wgmma pipeline: three cp.async stages of 32 words (96 KB of local memory; two work-groups an SM). See
#: benchmarks/RESULTS.md, "Local memory above 48 KB on NVIDIA's OpenCL".
DEEP = MmaConfig(4, 1, 2, 16, 32, stages=3, wg=2)


def deep_ok(device: Device, mode: str) -> bool:
    """Whether ``DEEP`` (a statically declared ``__local`` tile above the 48 KB that ``CL_DEVICE_LOCAL_MEM_SIZE``
    reports: NVIDIA's OpenCL builds and runs such kernels on Hopper, up to about 220 KB) builds and multiplies
    ``mode`` correctly on ``device`` (probed once; tf32 swapped, as its untransposed products run)."""
    if not wgmma_ok(device, mode):
        return False
    cfg = dataclasses.replace(DEEP, swap=1) if mode == "tf32" and swap_ok(device) else DEEP
    return _probed((device, f"{mode}-wgmma-deep"), device, mode, ldsm=1, cfg=cfg)


def tma_ok(device: Device, mode: str) -> bool:
    """Whether ``wgmma`` kernels whose tiles come by the Tensor Memory Accelerator (``MmaConfig.tma``: tensor
    maps encoded by the CUDA driver, ``tma_maps``) build and multiply ``mode`` correctly on ``device`` (probed
    once, in the layouts ``_probe`` checks). ``NETCL_TMA=0`` turns TMA off (cp.async copies instead, and no
    CUDA context is made)."""
    if os.environ.get("NETCL_TMA", "1").strip() == "0" or not wgmma_ok(device, mode):
        return False
    if mode == "tf32x3":  # (its wgmma kernels copy by TMA only: probed by ``wgmma_ok``)
        return True
    cfg = MmaConfig(4, 1, 1, 2, 8, stages=3, wg=1, tma=1)
    return _probed((device, f"{mode}-wgmma-tma"), device, mode, ldsm=1, cfg=cfg)


def tma_maps(device: Device, mode: str, cfg: MmaConfig, problem: Problem) -> bytes:
    """The two template tensor maps (A's, then B's; 128 bytes each) a ``cfg.tma`` kernel copies its tiles by:
    the operands of ``problem`` in their stored orientation (rows of lda / ldb elements), boxes and swizzle
    as the kernel's tiles (``tma_box``)."""
    element = {"f16": "float16", "bf16": "bfloat16"}.get(mode, "float32")
    size = 4 if mode in WORD_MODES else 2
    gpu, p, maps = _cuda_device(device), problem, b""
    for name, rows, ld, along_k in (("A", p.m, p.lda, not p.trans_a), ("B", p.n, p.ldb, p.trans_b)):
        box, swizzle = tma_box(cfg, mode, name, along_k)
        dims = (p.k, rows) if along_k else (rows, p.k)
        maps += cuda_driver.tensor_map(gpu, element, dims, (ld * size,), box, swizzle)
    return maps


@functools.cache
def _cuda_device(device: Device) -> cuda_driver.CudaDevice:
    """The CUDA device of an NVIDIA OpenCL ``device`` (its primary context retained once a process)."""
    return cuda_driver.device_by_pci(*cuda_driver.nvidia_pci(device))


def _tma_buffer(device: Device, mode: str, cfg: MmaConfig, problem: Problem, work_groups: int) -> Tensor:
    """The tensor-map argument of a ``cfg.tma`` kernel: the templates (``tma_maps``), then two slots a work-group,
    which every launch of the plan rewrites (its launches run one after another on the device's in-order queue)."""
    host = np.zeros((2 + 2 * work_groups) * 128, np.uint8)
    host[:256] = np.frombuffer(tma_maps(device, mode, cfg, problem), np.uint8)
    with paused(device.queue):  # made once per plan, also when the first product runs inside a capture
        return Tensor.from_host(device, host)


#: The wide TMA tile: two warpgroups of 64 x 256, three stages of 32 words (144 KB), the products of a stage in
#: flight while the previous stage's buffer refills. See benchmarks/RESULTS.md, "The Tensor Memory Accelerator for
#: the wgmma kernels".
WIDE = MmaConfig(8, 1, 1, 32, 32, stages=3, wg=1, tma=1)
#: the swapped default (tf32 of untransposed operands: 128 x 128 of C, each stage's products finished before its
#: B^T fragments are reloaded; see ``MmaConfig.problems``)
WIDE_SWAP = dataclasses.replace(DEEP, tma=1, swap=1)
#: the deepest TMA pipelines of the search (192 KB): what ``wide_ok`` probes (the swapped one for tf32)
_WIDEST = dataclasses.replace(WIDE, stages=4)
_WIDEST_SWAP = MmaConfig(8, 1, 2, 16, 32, stages=4, wg=2, tma=1, swap=1)
#: tf32x3 on wgmma: two warpgroups of 64 x 128, three TMA stages of 32 words, each split into hi and lo tiles (two
#: buffers of each split tile): 160 KB of untransposed A and transposed B (``MmaConfig.local_bytes``)
X3 = MmaConfig(8, 1, 1, 16, 32, stages=3, wg=2, tma=1)
#: its form for outputs of fewer 128 x 128 tiles than compute units: 128 x 64, four stages (144 KB)
X3_NARROW = MmaConfig(8, 1, 1, 8, 32, stages=4, wg=2, tma=1, split=0)
_X3_PROBE = MmaConfig(4, 1, 1, 2, 8, stages=3, wg=2, tma=1)


def wide_ok(device: Device, mode: str) -> bool:
    """Whether TMA kernels of ``_WIDEST``'s local memory (192 KB) build and multiply ``mode`` correctly on
    ``device`` (probed once; tf32 swapped where it can, as its untransposed products run)."""
    if not (deep_ok(device, mode) and tma_ok(device, mode)):
        return False
    cfg = _WIDEST_SWAP if mode == "tf32" and swap_ok(device) else _WIDEST
    return _probed((device, f"{mode}-wgmma-wide"), device, mode, ldsm=1, cfg=cfg)


def local_limit(device: Device, mode: str) -> int:
    """Bytes of local memory a tensor-core kernel of ``mode`` may declare on ``device``: ``_WIDEST``'s or
    ``DEEP``'s where they passed their probes, else what the driver reports."""
    reported = int(device.cl_device.local_mem_size)
    mode = "tf32" if mode == "tf32x3" else mode  # (the same TMA tiles, probed as tf32)
    for probed, cfg in ((wide_ok, _WIDEST), (deep_ok, DEEP)):
        if probed(device, mode):
            return max(reported, cfg.local_bytes(mode, False, False))
    return reported


def _grid() -> list[MmaConfig]:
    return [
        MmaConfig(2, 2, 4, 8, 16),
        MmaConfig(2, 4, 4, 4, 16),
        MmaConfig(4, 2, 2, 8, 16),
        MmaConfig(2, 2, 4, 4, 16),
        MmaConfig(2, 2, 2, 8, 16),
        MmaConfig(2, 2, 2, 4, 16),
        MmaConfig(2, 2, 2, 2, 16),
        MmaConfig(2, 2, 4, 8, 8),
        MmaConfig(4, 2, 4, 8, 8),
        MmaConfig(2, 4, 4, 8, 8),
        MmaConfig(4, 2, 2, 4, 8),
        # tf32 and f16: cp.async pipelines (no register staging, operands unconverted in local memory)
        MmaConfig(2, 2, 4, 8, 16, stages=3),  # swizzled tiles: three 16-word stages in 48 KB
        MmaConfig(2, 4, 4, 4, 16, stages=3),
        MmaConfig(2, 4, 4, 4, 16, stages=2),
        MmaConfig(2, 2, 4, 8, 16, stages=2),
        MmaConfig(4, 2, 2, 8, 16, stages=2),
        MmaConfig(2, 2, 4, 8, 8, stages=3),
        MmaConfig(2, 2, 4, 8, 8, stages=4),
        MmaConfig(2, 4, 4, 4, 8, stages=4),
        MmaConfig(4, 2, 2, 8, 8, stages=4),
        MmaConfig(2, 2, 2, 8, 16, stages=3),
        MmaConfig(2, 2, 2, 4, 16, stages=3),
        # Hopper's wgmma (tf32 and f16): one warpgroup of 2 x 64 x 128 (128 threads: more work-groups per
        # SM than two warpgroups of 64 x 128; see benchmarks/RESULTS.md, "The NVIDIA H200, 2026-11-26
        # (fourth session)"), 64 x 128 for fewer rows, 2 x 64 x 256
        MmaConfig(4, 1, 2, 16, 16, stages=3, wg=2),
        MmaConfig(4, 1, 2, 16, 16, stages=3, wg=1),
        MmaConfig(8, 1, 1, 16, 16, stages=3, wg=1),
        MmaConfig(8, 1, 1, 16, 16, stages=3, wg=2),
        MmaConfig(4, 1, 1, 16, 16, stages=3, wg=1),
        MmaConfig(8, 1, 1, 32, 8, stages=4, wg=1),
        MmaConfig(4, 1, 1, 32, 8, stages=4, wg=2),
        # deeper pipelines in more than 48 KB of local memory (``deep_ok``): 32-word stages, or five 16-word ones
        DEEP,
        MmaConfig(4, 1, 2, 16, 16, stages=5, wg=1),
        # tf32 of untransposed operands on wgmma: C^T = B^T A^T, B^T's fragments from registers
        MmaConfig(4, 1, 2, 16, 16, stages=3, wg=2, swap=1),
        MmaConfig(8, 1, 1, 16, 16, stages=3, wg=2, swap=1),
        MmaConfig(4, 1, 2, 16, 8, stages=5, wg=2, swap=1),
        MmaConfig(4, 1, 2, 8, 16, stages=3, wg=2, swap=1),
        MmaConfig(4, 1, 1, 16, 16, stages=4, wg=2, swap=1),
        MmaConfig(4, 1, 1, 32, 8, stages=4, wg=2, swap=1),
        dataclasses.replace(DEEP, swap=1),
        # tiles copied by the Tensor Memory Accelerator (``tma_ok``; above 96 KB: ``wide_ok``)
        WIDE,
        _WIDEST,
        MmaConfig(8, 1, 2, 16, 32, stages=3, wg=1, tma=1),
        MmaConfig(8, 1, 2, 16, 32, stages=4, wg=1, tma=1),
        dataclasses.replace(DEEP, tma=1),
        MmaConfig(4, 1, 2, 16, 32, stages=3, wg=1, tma=1),
        MmaConfig(4, 1, 2, 8, 32, stages=4, wg=2, tma=1),
        WIDE_SWAP,
        _WIDEST_SWAP,
        MmaConfig(8, 1, 1, 32, 32, stages=3, wg=2, tma=1, swap=1),
        MmaConfig(4, 1, 2, 8, 32, stages=4, wg=2, tma=1, swap=1),
        # tf32x3 on wgmma (with the TMA configs above of wg 2): 128 x 128, 64 x 128, 128 x 64, and in 96 KB (two
        # work-groups an SM) 128 x 128 of 16-word stages, 64 x 128, 128 x 64 and 64 x 64
        X3,
        dataclasses.replace(X3, stages=2),
        MmaConfig(4, 1, 1, 16, 32, stages=3, wg=2, tma=1),
        dataclasses.replace(X3_NARROW, split=1),
        MmaConfig(8, 1, 1, 16, 16, stages=4, wg=2, tma=1),
        MmaConfig(4, 1, 1, 16, 32, stages=2, wg=2, tma=1),
        MmaConfig(8, 1, 1, 8, 32, stages=2, wg=2, tma=1),
        MmaConfig(4, 1, 1, 8, 32, stages=4, wg=2, tma=1),
    ]


#: bf16x3's further candidates (``config``): 32-word stages, two of its 16-word products a stage
_BF16X3_MORE = (
    MmaConfig(2, 2, 2, 4, 32, stages=3),
    MmaConfig(2, 2, 4, 4, 32, stages=2),
    MmaConfig(2, 2, 2, 8, 32, stages=2),
)


def _default(device: Device, problem) -> MmaConfig:
    units = device.cl_device.max_compute_units
    for cfg in (MmaConfig(2, 2, 4, 8, 16), MmaConfig(2, 2, 2, 4, 16)):
        if problem.tiles(cfg.bm, cfg.bn) >= units:
            return cfg
    return MmaConfig(2, 2, 2, 2, 16)


#: The most work-groups a TMA product launches (unsplit): each has two tensor-map slots of 128 bytes in its plan's
#: buffer (``_tma_buffer``), 4 MB at this bound; a product of more tiles (a big batch) copies by cp.async.
TMA_MAX_WORK_GROUPS = 16384


def _valid(device: Device, cfg: MmaConfig, mode: str, problem) -> bool:
    d = device.cl_device
    local = cfg.local_bytes(mode, problem.trans_a, problem.trans_b)
    tiles = problem.tiles(cfg.bm, cfg.bn)
    return (
        not cfg.problems(mode, problem.trans_a, problem.trans_b)
        and cfg.threads <= d.max_work_group_size
        and (local <= d.local_mem_size or local <= local_limit(device, mode))
        and (not cfg.tma or tiles <= TMA_MAX_WORK_GROUPS)
    )


def _aligned(cfg: MmaConfig, problem, a_half: bool, b_half: bool) -> MmaConfig:
    """Vector loads only where the leading dims and batch strides keep 16-byte alignment (under ``pre``: those of
    the K-major problem the kernel multiplies)."""
    if cfg.pre:
        problem = k_major(problem)
    wa, wb = (8 if a_half else 4), (8 if b_half else 4)
    va = int(problem.lda % wa == 0 and all(d[1] % wa == 0 for d in problem.dims))
    vb = int(problem.ldb % wb == 0 and all(d[2] % wb == 0 for d in problem.dims))
    stages = cfg.stages if va and vb else 0  # cp.async copies 16-byte aligned chunks only
    return dataclasses.replace(cfg, va=va, vb=vb, stages=stages)


def config(device: Device, mode: str, problem, a_half: bool, b_half: bool) -> MmaConfig:
    layout = f"{'T' if problem.trans_a else 'N'}{'T' if problem.trans_b else 'N'}"
    # stored 16-bit operands ("w" + which) tune apart from float32 ones ("f"): cp.async copies only the former
    operands = f"w{int(a_half)}{int(b_half)}" if a_half or b_half else "f"
    key = tune.shape_class(f"mma-{mode}", problem.m, problem.n, problem.k, problem.batch > 1, layout, operands)
    ldsm = _probe_result(device, mode) or 0
    candidates = [_aligned(dataclasses.replace(c, ldsm=ldsm), problem, a_half, b_half) for c in _grid()]
    staged = _async_ok(device, mode) and (mode in WORD_MODES or (a_half and b_half))  # f16 of float32: converts
    # float32 operands rounded to f16 / bf16 as they are loaded: wgmma from tiles filled through registers
    converts = not staged and mode in ("f16", "bf16") and not (a_half or b_half)
    if not staged:
        registers = [dataclasses.replace(c, stages=0) for c in candidates if c.wg == 2 and not (c.swap or c.tma)]
        candidates = [c for c in candidates if not c.stages] + (registers if converts else [])
    if not converts:  # (unaligned stored operands: mma.sync)
        candidates = [c for c in candidates if not (c.wg and not c.stages)]
    warpgroups = wgmma_ok(device, mode) if staged else converts and wgmma_ok(device, mode, converts=True)
    if not warpgroups:
        candidates = [c for c in candidates if not c.wg]
    if warpgroups and mode in PRE_MODES and (problem.trans_a or not problem.trans_b):  # wgmma after transposes
        pre = [dataclasses.replace(c, ldsm=ldsm, pre=1) for c in _grid() if c.wg and c.tma and not c.swap]
        candidates += [_aligned(c, problem, a_half, b_half) for c in pre]
    swapped = warpgroups and mode == "tf32" and not (problem.trans_a or problem.trans_b) and swap_ok(device)
    if not swapped:
        candidates = [c for c in candidates if not c.swap]
    copied = warpgroups and staged and tma_ok(device, mode)  # the Tensor Memory Accelerator
    if not copied:
        candidates = [c for c in candidates if not c.tma]
    if mode == "bf16x3":
        more = [_aligned(dataclasses.replace(c, ldsm=ldsm), problem, a_half, b_half) for c in _BF16X3_MORE]
        candidates += more if staged else [dataclasses.replace(c, stages=0) for c in more]
    candidates = [c for c in dict.fromkeys(candidates) if _valid(device, c, mode, problem)]
    big = [c for c in candidates if c.bm * c.bn >= 128 * 128 and -(-problem.m // c.bm) >= 16]
    candidates += [dataclasses.replace(c, group=8) for c in big]
    candidates += split_twins(device, problem, candidates, mode)
    fallback = dataclasses.replace(_default(device, problem), ldsm=ldsm)
    if mode == "tf32x3":  # three mma a tile, 8-word stages, 4 cp.async deep (see benchmarks/RESULTS.md, "tf32x3")
        fallback = dataclasses.replace(fallback, bkw=8, stages=4 if staged else 0)
        # wgmma where the probes passed (1.0-1.6x cuBLAS fp32 at 512-4096 against mma.sync's 0.6-1.0x; see
        # benchmarks/RESULTS.md, "tf32x3 on wgmma"): an untransposed A split along K only where its tiles would
        # fill less than half the compute units, an untransposed B transposed first; a transposed A (a weight
        # gradient: few tiles, a long K) split in the kernel's stages, two of them (the K-major hi tiles of both
        # operands take the local memory of the third), and along K
        units = device.cl_device.max_compute_units
        if problem.trans_a:
            x3 = dataclasses.replace(X3, stages=2)
        else:
            x3 = X3 if problem.tiles(X3.bm, X3.bn) >= units else X3_NARROW
            split = int(problem.tiles(x3.bm, x3.bn) < units // 2)
            x3 = dataclasses.replace(x3, split=split, pre=int(not problem.trans_b))
        x3 = _aligned(dataclasses.replace(x3, ldsm=ldsm), problem, a_half, b_half)
        if copied and _valid(device, x3, mode, problem):
            fallback = x3
    if mode == "bf16x3":  # without a search: 64 x 64, 16-word stages (two k-steps a product), 3 cp.async deep
        fallback = _aligned(MmaConfig(2, 2, 2, 4, 16, ldsm=ldsm, stages=3 if staged else 0), problem, a_half, b_half)
    if mode in ("tf32", "f16", "bf16") and fallback.bm * fallback.bn >= 128 * 128 and staged:
        # 3 cp.async stages of 16 words in swizzled tiles, else 2: the best of the grid (see
        # benchmarks/RESULTS.md, "Deeper pipelines for the tensor-core kernel")
        three = dataclasses.replace(fallback, stages=3)
        fallback = three if _valid(device, three, mode, problem) else dataclasses.replace(fallback, stages=2)
        wide = MmaConfig(4, 1, 2, 16, 16, ldsm=ldsm, stages=3, wg=2)  # wgmma where the layout allows it
        if warpgroups and deep_ok(device, mode):
            wide = dataclasses.replace(DEEP, ldsm=ldsm)
        if swapped:
            wide = dataclasses.replace(wide, swap=1)
        if copied and wide_ok(device, mode):  # grouped (a 128 x 256 tile's operands from L2), not split
            wide = WIDE_SWAP if swapped else WIDE
            wide = dataclasses.replace(wide, ldsm=ldsm, group=8 * (-(-problem.m // wide.bm) >= 16), split=0)
        if warpgroups and _valid(device, _aligned(wide, problem, a_half, b_half), mode, problem):
            fallback = wide
    if converts and warpgroups and fallback.bm * fallback.bn >= 128 * 128:
        # faster than mma.sync's best (see benchmarks/RESULTS.md, "wgmma for float32 operands rounded in the kernel")
        wide = MmaConfig(4, 1, 2, 16, 16, ldsm=ldsm, wg=2)
        if _valid(device, _aligned(wide, problem, a_half, b_half), mode, problem):
            fallback = wide
    if not _valid(device, fallback, mode, problem):
        fallback = candidates[-1] if candidates else MmaConfig(1, 1, 1, 2, 8, 1, 1, ldsm)
    trial = _Trial(device, mode, problem, a_half, b_half)
    cfg = tune.select(device, key, candidates, fallback, trial, dataclasses.asdict, lambda d: MmaConfig(**d))
    if cfg.stages and not staged:  # a store written before the key told stored operands apart
        cfg = fallback
    return _aligned(cfg, problem, a_half, b_half)


def _view_flags(cfg: MmaConfig, mode: str, problem, views: tuple) -> MmaConfig:
    """``cfg`` for a product with operand ``views``: a stored operand's 16-byte flag as alignment
    allows; a view's flag 1 where its elements can be copied by cp.async (tf32 and the view's
    ``offsets4``), else 0 (register staging); cp.async stages only where both operands can."""
    stored = _aligned(dataclasses.replace(cfg, stages=0), problem, False, False)
    flags = []
    for view, flag in zip(views[:2], (stored.va, stored.vb), strict=True):
        flags.append(flag if view is None else int(mode in WORD_MODES and bool(view.offsets4)))
    stages = cfg.stages if cfg.stages and all(flags) else 0
    return dataclasses.replace(cfg, va=flags[0], vb=flags[1], stages=stages)


def view_candidates(device: Device, mode: str, problem, views: tuple) -> list[MmaConfig]:
    """The configs a search of a product with operand ``views`` tries: register-staged ones, and
    the cp.async pipelines where both operands can be copied that way (``_view_flags``)."""
    ldsm = _probe_result(device, mode) or 0
    async_ok = _async_ok(device, mode)
    out = []
    for c in _grid():
        if c.wg:  # operand views copy through the mma.sync kernels' tiles
            continue
        c = _view_flags(dataclasses.replace(c, ldsm=ldsm), mode, problem, views)
        if (async_ok or not c.stages) and _valid(device, c, mode, problem):
            out.append(c)
    return list(dict.fromkeys(out))


def view_default(device: Device, mode: str, problem, views: tuple) -> MmaConfig:
    """The config of a product with operand ``views`` when nothing was searched: ``_default``'s
    rule, with 64-row tiles for at most 64 rows (a convolution with 64 output channels)."""
    cfg = MmaConfig(2, 2, 2, 8, 16) if problem.m <= 64 else _default(device, problem)
    return _view_flags(dataclasses.replace(cfg, ldsm=_probe_result(device, mode) or 0), mode, problem, views)


class _Trial:
    def __init__(self, device: Device, mode: str, problem, a_half: bool, b_half: bool) -> None:
        self.device, self.mode, self.problem = device, mode, problem
        word = bfloat16 if mode == "bf16" else float16  # (bfloat16 words: bfloat16 tensors, ``mode_for``)
        self.dtypes = (word if a_half else float32, word if b_half else float32)
        self.operands = None

    def __call__(self, cfg: MmaConfig) -> Callable[[], Tensor]:
        p = self.problem
        if self.operands is None:
            a_elems, b_elems = p.operand_sizes
            self.operands = (
                tune.trial_operand(a_elems, self.dtypes[0], self.device, 1),
                tune.trial_operand(b_elems, self.dtypes[1], self.device, 2),
                Tensor.empty((p.batch, p.m, p.n), float32, self.device),
            )
        a, b, out = self.operands
        return trial_run(self._plan(cfg), a, b, out=out)

    def build(self, cfg: MmaConfig) -> None:
        """The candidate's programs only (``tune.build_ahead``): its plan, except for a TMA candidate, whose plan
        uploads tensor maps (its trial builds it)."""
        if not cfg.tma:
            self._plan(cfg)

    def _plan(self, cfg: MmaConfig):
        p = self.problem
        cfg = _aligned(cfg, p, *(d != float32 for d in self.dtypes))
        return make_plan(self.device, self.mode, *self.dtypes, float32, (p.batch, p.m, p.n), p, cfg=cfg)


def make_plan(
    device: Device,
    mode: str,
    a_dtype,
    b_dtype,
    out_dtype,
    out_shape,
    problem,
    epilogue=IDENTITY,
    cfg=None,
    views: tuple[OperandView | None, ...] = (None, None),
):
    """The tensor-core kernel's plan for ``problem`` (split along K when the output is small).

    ``views`` as in ``gemm_plan.make_plan``: an operand read through an expression loads element by
    element (cp.async stages only from a tf32 view's ``offsets4``, ``_view_flags``); split along K, a
    product with a C view writes plain rows and the split sum stores through the view.
    """
    a_half, b_half = _words(a_dtype), _words(b_dtype)
    if cfg is None:
        cfg = config(device, mode, problem, a_half, b_half)
    if cfg.pre:  # operands stored M/N-major transposed first, then the K-major problem's kernel
        if any(v is not None for v in views):
            raise ValueError("gemm_mma: pre (operands transposed first) multiplies stored operands, not views")
        inner = k_major(problem)
        cfg = dataclasses.replace(cfg, pre=0)
        plan = make_plan(device, mode, a_dtype, b_dtype, out_dtype, out_shape, inner, epilogue, cfg)
        return TransposedPlan(device, problem, plan)
    if views[0] is not None or views[1] is not None:
        cfg = _view_flags(cfg, mode, problem, views)
    splits, chunk = 1, problem.k
    if cfg.split:
        splits, chunk = split_count(problem, cfg.bm, cfg.bn, cfg.bk_elements(mode), device, cfg.split)
    c_dtype = float32 if splits > 1 else out_dtype
    idx = index_kind(problem)
    store = epilogue if splits == 1 else IDENTITY  # split: the partial products are raw, the sum applies it
    kernel_views = views if splits == 1 else views[:2]  # split: plain rows, the sum stores through C's view
    key = (
        "gemm-mma",
        mode,
        cfg,
        problem.trans_a,
        problem.trans_b,
        a_dtype.str,
        b_dtype.str,
        c_dtype.str,
        idx,
        store,
        kernel_views,
    )

    def source() -> str:
        return mma_source(
            cfg, mode, problem.trans_a, problem.trans_b, a_dtype, b_dtype, c_dtype, idx, store, kernel_views
        )  # fmt: skip

    args = ARG_DTYPES + [None] * cfg.tma + store.arg_dtypes()
    kernel = get_kernel(key, device, source, "netcl_gemm", args).kernel
    blocks = (-(-problem.n // cfg.bn), -(-problem.m // cfg.bm), problem.batch * splits)
    gsize = (blocks[0] * cfg.threads, *blocks[1:])
    maps = (_tma_buffer(device, mode, cfg, problem, math.prod(blocks)),) if cfg.tma else ()
    return finish_plan(
        device, kernel, gsize, (cfg.threads, 1, 1), problem, splits, chunk, out_shape, out_dtype, epilogue, maps,
        views=views,
    )  # fmt: skip
