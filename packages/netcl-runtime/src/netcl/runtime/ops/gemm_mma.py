"""Tensor cores through inline PTX: which devices have them (a probe), and running the mma kernel.

A device qualifies when it is an NVIDIA GPU and a probe kernel with ``mma.sync`` of each mode
builds and multiplies a 16 x 8 x 16 product correctly (checked against NumPy once per device
and process). Every other device, and a device whose probe fails, keeps the portable kernel;
asking for tensor cores there logs one line per device, never an error. ``NETCL_MMA=0``
turns the path off (to compare with the portable kernel).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading

import numpy as np

from netcl.core import Device, Tensor
from netcl.core.dtypes import float16, float32
from netcl.runtime.ops._common import get_kernel
from netcl.runtime.ops.gemm_mma_source import MmaConfig, mma_source
from netcl.runtime.ops.gemm_source import IDENTITY, Epilogue

log = logging.getLogger("netcl.gemm")
_PROBED: dict[tuple[Device, str], bool] = {}
_WARNED: set[Device] = set()
_LOCK = threading.Lock()


def _nvidia(device: Device) -> bool:
    return device.kind == "opencl" and device.is_gpu and "NVIDIA" in device.platform_name.upper()


def mode_for(device: Device, a_dtype: np.dtype, b_dtype: np.dtype, precision: str) -> str | None:
    """ "f16", "bf16", "tf32" or None (portable kernel) for operands of these dtypes."""
    if a_dtype == float16 and b_dtype == float16:
        mode = "f16"
    elif a_dtype == float32 and b_dtype == float32 and precision != "highest":
        mode = "tf32" if precision == "high" else "bf16"
    else:
        return None
    if device.kind != "opencl" or os.environ.get("NETCL_MMA", "1").strip() == "0":
        return None
    if available(device, mode):
        return mode
    if device not in _WARNED:
        _WARNED.add(device)
        log.warning("netcl: no tensor cores on %s; %s products use the portable kernel", device.cl_device.name, mode)
    return None


def available(device: Device, mode: str) -> bool:
    """Whether ``device`` ran the probe of ``mode`` correctly (probed once per process)."""
    if not _nvidia(device):
        return False
    key = (device, mode)
    with _LOCK:
        known = _PROBED.get(key)
    if known is None:
        known = _probe(device, mode)
        with _LOCK:
            _PROBED[key] = known
    return known


def _probe(device: Device, mode: str) -> bool:
    """Build the smallest mma kernel of ``mode`` and check a 16 x 8 x 16 product against NumPy."""
    from netcl.runtime.errors import CompileError, LaunchError
    from netcl.runtime.ops.gemm import Problem

    rng = np.random.default_rng(7)
    dtype = float16 if mode == "f16" else float32
    a = rng.uniform(-1, 1, (16, 16)).astype(dtype)
    b = rng.uniform(-1, 1, (16, 8)).astype(dtype)
    cfg = MmaConfig(1, 1, 1, 1, 8, 0, 0)
    try:
        if dtype == float16 and not device.supports(float16):
            return False
        ta, tb = Tensor.from_host(device, a), Tensor.from_host(device, b)
        out = Tensor.empty((16, 8), float32, device)
        launch_mma(device, mode, cfg, ta, tb, out, Problem(16, 8, 16, False, False, ()), 1, 16, IDENTITY, None)
        got = out.to_host()
    except (CompileError, LaunchError) as exc:
        log.info("netcl: tensor-core probe (%s) failed on %s: %s", mode, device.cl_device.name, str(exc)[:3000])
        return False
    expected = a.astype(np.float64) @ b.astype(np.float64)
    # tf32 / bf16 operand rounding: relative 2**-11 / 2**-8 per product, 16 products of |x| <= 1
    tol = {"f16": 1e-2, "tf32": 2e-2, "bf16": 1.5e-1}[mode]
    ok = bool(np.all(np.abs(got - expected) <= tol))
    if not ok:
        log.warning("netcl: tensor-core probe (%s) on %s gave wrong results; not used", mode, device.cl_device.name)
    return ok


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
        MmaConfig(4, 2, 2, 4, 8),
    ]


def _default(device: Device, problem) -> MmaConfig:
    units = device.cl_device.max_compute_units
    for cfg in (MmaConfig(2, 2, 4, 8, 16), MmaConfig(2, 2, 2, 4, 16)):
        if -(-problem.m // cfg.bm) * -(-problem.n // cfg.bn) * problem.batch >= units:
            return cfg
    return MmaConfig(2, 2, 2, 2, 16)


def _valid(device: Device, cfg: MmaConfig, mode: str, problem, a_half: bool, b_half: bool) -> bool:
    d = device.cl_device
    return (
        not cfg.problems(mode, problem.trans_a, problem.trans_b, a_half, b_half)
        and cfg.threads <= d.max_work_group_size
        and cfg.local_bytes() <= d.local_mem_size
    )


def _aligned(cfg: MmaConfig, problem, a_half: bool, b_half: bool) -> MmaConfig:
    """Vector loads only where the leading dims and batch strides keep 16-byte alignment."""
    wa, wb = (8 if a_half else 4), (8 if b_half else 4)
    va = int(problem.lda % wa == 0 and all(d[1] % wa == 0 for d in problem.dims))
    vb = int(problem.ldb % wb == 0 and all(d[2] % wb == 0 for d in problem.dims))
    return dataclasses.replace(cfg, va=va, vb=vb)


def config(device: Device, mode: str, problem, a_half: bool, b_half: bool) -> MmaConfig:
    from netcl.runtime import tune

    layout = f"{'T' if problem.trans_a else 'N'}{'T' if problem.trans_b else 'N'}"
    key = tune.shape_class(f"mma-{mode}", problem.m, problem.n, problem.k, problem.batch > 1, layout, "f")
    candidates = [c for c in _grid() if _valid(device, c, mode, problem, a_half, b_half)]
    fallback = _default(device, problem)
    if not _valid(device, fallback, mode, problem, a_half, b_half):
        fallback = candidates[-1] if candidates else MmaConfig(1, 1, 1, 1, 8)
    trial = _Trial(device, mode, problem, a_half, b_half)
    cfg = tune.select(device, key, candidates, fallback, trial, dataclasses.asdict, lambda d: MmaConfig(**d))
    return _aligned(cfg, problem, a_half, b_half)


class _Trial:
    def __init__(self, device: Device, mode: str, problem, a_half: bool, b_half: bool) -> None:
        self.device, self.mode, self.problem = device, mode, problem
        self.dtypes = (float16 if a_half else float32, float16 if b_half else float32)
        self.operands = None

    def __call__(self, cfg: MmaConfig) -> None:
        from netcl.runtime.ops.layout import full

        p = self.problem
        if self.operands is None:
            a_elems = p.m * p.k + sum((d[0] - 1) * d[1] for d in p.dims)
            b_elems = p.k * p.n + sum((d[0] - 1) * d[2] for d in p.dims)
            self.operands = (
                full((a_elems,), 0.5, self.dtypes[0], self.device),
                full((b_elems,), 0.25, self.dtypes[1], self.device),
                Tensor.empty((p.batch, p.m, p.n), float32, self.device),
            )
        a, b, out = self.operands
        cfg = _aligned(cfg, p, *(d == float16 for d in self.dtypes))
        run(self.device, self.mode, a, b, out, p, cfg=cfg)


def run(device: Device, mode: str, a, b, out, problem, epilogue: Epilogue = IDENTITY, bias=None, cfg=None):
    """``out = op(a) @ op(b)`` (+ epilogue) on tensor cores; split along K when the output is small."""
    from netcl.runtime.ops.gemm import split_count
    from netcl.runtime.ops.layout import cast
    from netcl.runtime.ops.reduce import sum as reduce_sum

    a_half, b_half = a.dtype == float16, b.dtype == float16
    if cfg is None:
        cfg = config(device, mode, problem, a_half, b_half)
    bk = cfg.bkw * (1 if mode == "tf32" else 2)
    splits, chunk = 1, problem.k
    if epilogue.is_identity:
        splits, chunk = split_count(problem, cfg.bm, cfg.bn, bk, device)
    if splits > 1:
        work = Tensor.empty((splits, *out.shape), float32, device)
        launch_mma(device, mode, cfg, a, b, work, problem, splits, chunk, epilogue, bias)
        summed = reduce_sum(work, axis=0)
        return summed if summed.dtype == out.dtype else cast(summed, out.dtype)
    launch_mma(device, mode, cfg, a, b, out, problem, 1, chunk, epilogue, bias)
    return out


def launch_mma(device, mode, cfg, a, b, c, problem, splits, chunk, epilogue, bias) -> None:
    from netcl.runtime.launch import launch
    from netcl.runtime.ops.gemm import ARG_DTYPES

    m, n = problem.m, problem.n
    big = max(m * problem.lda, problem.k * problem.lda, n * problem.ldb, problem.k * problem.ldb, m * n) >= 2**31
    idx = "long" if big else "int"
    key = (
        "gemm-mma",
        mode,
        cfg,
        problem.trans_a,
        problem.trans_b,
        a.dtype.str,
        b.dtype.str,
        c.dtype.str,
        idx,
        epilogue,
    )

    def source() -> str:
        return mma_source(cfg, mode, problem.trans_a, problem.trans_b, a.dtype, b.dtype, c.dtype, idx, epilogue)

    kernel = get_kernel(key, device, source, "netcl_gemm", ARG_DTYPES + ([None] if bias is not None else [])).kernel
    dims = [(1, 0, 0)] * (3 - len(problem.dims)) + list(problem.dims)
    gsize = (-(-n // cfg.bn) * cfg.threads, -(-m // cfg.bm), problem.batch * splits)
    extra = (bias,) if bias is not None else ()
    launch(
        kernel,
        gsize,
        (cfg.threads, 1, 1),
        m,
        n,
        problem.k,
        a,
        problem.lda,
        b,
        problem.ldb,
        c,
        n,
        dims[1][0],
        dims[2][0],
        dims[0][1],
        dims[1][1],
        dims[2][1],
        dims[0][2],
        dims[1][2],
        dims[2][2],
        m * n,
        splits,
        chunk,
        problem.batch * m * n,
        *extra,
        queue=device.queue,
    )
