"""Which tile config a product uses: the candidates a search tries, and the defaults without one."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from functools import cache

import numpy as np

from netcl.core import Device, Tensor
from netcl.runtime import tune
from netcl.runtime.ops.gemm_plan import Plan, Problem, make_plan, split_twins, trial_run, with_alignment
from netcl.runtime.ops.gemm_source import IDENTITY, Epilogue, GemmConfig


def fits(device: Device, cfg: GemmConfig, itemsize: int, problem: Problem) -> bool:
    """Whether ``device`` can run ``cfg`` on ``problem``'s layout with operands of ``itemsize`` bytes
    (the config supports the layout; its work-group and local memory are within the device's limits)."""
    d = device.cl_device
    return (
        not cfg.problems(problem.trans_a, problem.trans_b)
        and cfg.group_size <= d.max_work_group_size
        and cfg.local_bytes(itemsize) <= d.local_mem_size
    )


#: Candidate tiles: (threads M x N, per-thread M x N, K depth, K slices); 4-wide global loads, local
#: reads as wide as the thread's block allows (4 at most).
_TILES = [
    (16, 16, 8, 8, 8, 1),
    (16, 16, 8, 8, 16, 1),
    (16, 16, 8, 4, 16, 1),
    (16, 16, 4, 8, 16, 1),
    (8, 16, 8, 8, 16, 1),
    (16, 8, 8, 8, 16, 1),
    (16, 16, 4, 4, 16, 1),
    (16, 16, 4, 4, 32, 1),
    (8, 8, 4, 4, 32, 1),
    (16, 16, 2, 2, 32, 1),
    (8, 8, 2, 2, 32, 1),
    # small outputs with a long K (the MLP layers' 128 x 512 at K = 512-784): 16 x 32 tiles, and K
    # slices (two or four thread sets per block taking turns along K; see benchmarks/RESULTS.md,
    # "Measurements moved out of source docstrings", gemm_configs.py)
    (8, 16, 2, 2, 32, 1),
    (8, 16, 2, 2, 32, 2),
    (8, 8, 2, 4, 32, 2),
    (8, 8, 2, 2, 32, 2),
    (8, 8, 2, 2, 32, 4),
    (8, 8, 4, 4, 16, 4),
    # 128 outputs per thread (16 x 8, 8 x 16): with vector reads from local memory the fastest big tiles
    # on the H200 (see benchmarks/RESULTS.md, "Measurements moved out of source docstrings", gemm_configs.py)
    (8, 16, 16, 8, 8, 1),
    (8, 16, 16, 8, 16, 1),
    (16, 16, 16, 8, 8, 1),
    (16, 16, 8, 16, 8, 1),
    (8, 32, 16, 4, 8, 1),
    (8, 16, 16, 4, 16, 1),
    (16, 8, 16, 8, 16, 1),
]


@cache
def _grid() -> tuple[GemmConfig, ...]:
    """The candidate configs of ``_TILES``, in its order."""
    return tuple(GemmConfig(wgm, wgn, tm, tn, bk, 4, 4, min(4, tm, tn), ks=ks) for wgm, wgn, tm, tn, bk, ks in _TILES)


def _is_nvidia(device: Device) -> bool:
    return "NVIDIA" in device.platform_name.upper()


def default(device: Device, problem) -> GemmConfig:
    """Without a search: big tiles when they fill the device, smaller ones (and split-K) otherwise."""
    if not device.is_gpu:
        return GemmConfig(16, 16, 4, 4, 16, 4, 4, 4)
    units = device.cl_device.max_compute_units
    blocks = -(-problem.m // 128) * -(-problem.n // 128) * problem.batch
    if blocks >= units and _is_nvidia(device):  # 128 accumulators per thread fit NVIDIA's 255 registers
        return GemmConfig(8, 16, 16, 8, 8, 4, 4, 4)
    if blocks >= units:
        return GemmConfig(16, 16, 8, 8, 16, 4, 4, 4)
    blocks = -(-problem.m // 64) * -(-problem.n // 64) * problem.batch
    if blocks >= units // 2:
        return GemmConfig(16, 16, 4, 4, 16, 4, 4, 4)
    return GemmConfig(16, 16, 2, 2, 32, 4, 4, 2)


def portable(device: Device, problem, dtype: np.dtype, epilogue: Epilogue = IDENTITY) -> GemmConfig:
    """The tuned config of ``problem``'s shape class on ``device`` (searching at first use), or the default.

    A product with a code epilogue (``netcl.jit``'s fused elementwise tail) has its own key and its
    trials run that epilogue: its arithmetic and extra stores per element can make another tile the
    fastest (see benchmarks/RESULTS.md, "Tile searches in the GPT block's first capture").
    """
    itemsize = np.dtype(dtype).itemsize
    layout = f"{'T' if problem.trans_a else 'N'}{'T' if problem.trans_b else 'N'}"
    key = tune.shape_class("portable", problem.m, problem.n, problem.k, problem.batch > 1, layout, np.dtype(dtype).str)
    if epilogue.code:
        key += f"|e{epilogue_digest(epilogue)}"
    fallback = default(device, problem)
    if not fits(device, fallback, itemsize, problem):
        fallback = GemmConfig(8, 8, 1, 1, 8, 1, 1, 1)
    candidates = [c for c in _grid() if fits(device, c, itemsize, problem)]
    big = [c for c in candidates if c.bm * c.bn >= 128 * 64 and -(-problem.m // c.bm) >= 16]
    candidates += [dataclasses.replace(c, group=8) for c in big]
    if _is_nvidia(device):  # a register cap: two 256-thread work-groups per SM
        capped = [c for c in big if c.threads == 256 and c.tm * c.tn == 64]
        candidates += [dataclasses.replace(c, maxreg=128, group=g) for c in capped for g in (0, 8)]
    candidates += split_twins(device, problem, candidates, None)
    return tune.select(
        device,
        key,
        candidates,
        fallback,
        trial=_Trial(device, problem, np.dtype(dtype), epilogue if epilogue.code else IDENTITY),
        encode=dataclasses.asdict,
        decode=lambda d: GemmConfig(**d),
    )


def epilogue_digest(epilogue: Epilogue) -> str:
    """A short stable name of ``epilogue`` for search keys (the same in every process and run)."""
    return hashlib.sha256(repr(epilogue).encode()).hexdigest()[:12]


class _Trial:
    """Runs one candidate on scratch operands of the problem's size (made once per search), with
    ``epilogue`` and scratch values for its bias and operands."""

    def __init__(self, device: Device, problem, dtype: np.dtype, epilogue: Epilogue = IDENTITY) -> None:
        self.device, self.problem, self.dtype, self.epilogue = device, problem, dtype, epilogue
        self.operands: tuple[Tensor, Tensor, Tensor] | None = None
        self.bias: Tensor | None = None
        self.extras: list[Tensor | float] = []

    def __call__(self, cfg: GemmConfig) -> Callable[[], Tensor]:
        if self.operands is None:
            self._make_operands()
        a, b, out = self.operands
        return trial_run(self._plan(cfg), a, b, self.bias, out, self.extras)

    def build(self, cfg: GemmConfig) -> None:
        """The candidate's programs only (``tune.build_ahead``): its plan, which allocates nothing."""
        self._plan(cfg)

    def _plan(self, cfg: GemmConfig) -> Plan:
        p = self.problem
        return make_plan(
            self.device, self.dtype, self.dtype, (p.batch, p.m, p.n), p, self.epilogue, cfg=with_alignment(cfg, p)
        )

    def _make_operands(self) -> None:
        p, device, epilogue = self.problem, self.device, self.epilogue
        a_elems, b_elems = p.operand_sizes
        a = tune.trial_operand(a_elems, self.dtype, device, 1)
        b = tune.trial_operand(b_elems, self.dtype, device, 2)
        self.operands = (a, b, Tensor.empty((p.batch, p.m, p.n), self.dtype, device))
        sizes = {"full": p.batch * p.m * p.n, "out": p.batch * p.m * p.n, "col": p.n, "row": p.batch * p.m}
        if epilogue.bias != "none":
            self.bias = tune.trial_operand(p.n if epilogue.bias == "col" else p.m, np.float32, device, 3)
        self.extras = [
            0.5 if kind == "scalar" else tune.trial_operand(sizes[kind], np.float32, device, 4 + k)
            for k, kind in enumerate(epilogue.operands)
        ]
