"""pytest-benchmark: each reference workload, forward and forward+backward, fused vs un-fused vs NumPy.

Run with ``hatch run pytest benchmarks/bench_workloads.py``; ``NETCL_BENCH_SIZE`` sets the
elements per tensor (default 1M). Each round ends with the device queue drained, so the
wall-clock numbers include the device work.
"""

from __future__ import annotations

import os

import pytest
from cases import bias_gelu_case, chain8_case, mlp_block_case

from netcl.core import get_device

SIZE = int(os.environ.get("NETCL_BENCH_SIZE", 1 << 20))
BUILDERS = {"chain8": chain8_case, "bias_gelu": bias_gelu_case, "mlp_block": mlp_block_case}
_CASES: dict[str, object] = {}


def _case(name: str):
    if name not in _CASES:
        _CASES[name] = BUILDERS[name](get_device(), SIZE)
    return _CASES[name]


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("variant", ["netcl fused", "netcl unfused", "numpy"])
@pytest.mark.parametrize("workload", list(BUILDERS))
def test_workload(benchmark, workload, variant, mode):
    case = _case(workload)
    runner = case.runners.get(variant, {}).get(mode)
    if runner is None:
        pytest.skip(f"{variant} has no {mode} for {workload}")
    device = get_device()

    def step():
        runner()
        if device.queue is not None:
            device.queue.finish()

    benchmark.group = f"{workload} {mode}"
    benchmark.extra_info.update(elements=case.elements, min_bytes=case.min_bytes[mode])
    benchmark.pedantic(step, rounds=5, warmup_rounds=1)
