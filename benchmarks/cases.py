"""The benchmark workloads (docs/architecture.md names): how to run each variant, and the bytes it must move.

Adding a workload is one registration line at the bottom of this file (or of any module that
``harness`` imports)::

    register_workload("matmul", matmul_case)

where ``matmul_case(device, n) -> Case | None`` builds the runners (None: cannot run on this
device; print why on stderr). A ``Case`` maps variant names to ``{"fwd": runner, "fwd+bwd":
runner}`` (either mode may be missing); ``primary`` names the variant the verdict is about
(default "netcl fused") and every other variant is compared with it. ``min_bytes`` gives GB/s;
leave a mode out of it when bandwidth means nothing there (e.g. compute-bound matmul).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from measure import rand

import netcl.autograd as ag
from netcl.core import Device
from netcl.jit import jit_compile, workloads
from netcl.runtime import ops as rops

F32 = 4
Runner = Callable[[], object]


@dataclass
class Case:
    """One workload at one size: runners per variant and mode ("fwd", "fwd+bwd")."""

    name: str
    description: str
    elements: int
    #: minimum bytes the workload must move, per mode
    min_bytes: dict[str, int]
    runners: dict[str, dict[str, Runner]] = field(default_factory=dict)
    #: host arrays, for peers that build their own tensors
    arrays: list[np.ndarray] = field(default_factory=list)
    #: the variant the verdict line is about; every other variant is compared with it
    primary: str = "netcl fused"


Builder = Callable[[Device, int], "Case | None"]

#: name -> builder, in registration order (the order of the tables)
WORKLOADS: dict[str, Builder] = {}


def register_workload(name: str, builder: Builder) -> Builder:
    """Add (or replace) a workload of ``hatch run bench``; returns ``builder``."""
    WORKLOADS[name] = builder
    return builder


def _leaves(arrays: list[np.ndarray], device: Device, requires_grad: bool) -> list[ag.Node]:
    return [ag.tensor(a, requires_grad=requires_grad, device=device) for a in arrays]


def _forward(fn: Callable, nodes: list[ag.Node]) -> Runner:
    def run() -> object:
        with ag.no_grad():
            return fn(*nodes)

    return run


def _forward_backward(fn: Callable, nodes: list[ag.Node], upstream: ag.Node | None) -> Runner:
    grad = upstream.value if upstream is not None else None

    def run() -> object:
        for node in nodes:  # a fresh step: no accumulation kernels into last step's grads
            node.grad = None
            node.value.grad = None
        with ag.Tape() as tape:
            out = fn(*nodes)
        tape.backward(out, grad=grad)
        return out

    return run


def _netcl_variants(fn: Callable, arrays: list[np.ndarray], device: Device, out_shape, seed: int = 99):
    fused = jit_compile(fn)
    grads = _leaves(arrays, device, True)
    plain = _leaves(arrays, device, False)
    upstream = ag.tensor(rand(out_shape, seed), device=device) if out_shape else None
    return {
        "netcl fused": {"fwd": _forward(fused, plain), "fwd+bwd": _forward_backward(fused, grads, upstream)},
        "netcl unfused": {"fwd": _forward(fn, plain), "fwd+bwd": _forward_backward(fn, grads, upstream)},
    }


def chain8_case(device: Device, n: int) -> Case:
    arrays = [rand((n,), seed) for seed in range(3)]
    case = Case(
        "chain8",
        "8 elementwise ops, 3 inputs, 1 output",
        n,
        # fwd: read x, a, b, write out. bwd: read x, a, b, upstream, write 3 grads.
        {"fwd": 16 * n, "fwd+bwd": (16 + 28) * n},
        _netcl_variants(workloads.chain8, arrays, device, (n,)),
        arrays,
    )
    x, a, b = arrays
    case.runners["numpy"] = {"fwd": lambda: _chain8_numpy(x, a, b)}
    return case


def _chain8_numpy(x: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    h = np.maximum(x * a + b, np.float32(0)) * np.float32(0.5)
    h = np.float32(1) / (np.float32(1) + np.exp(-h)) - x
    h = np.tanh(h)
    return h * h


def bias_gelu_case(device: Device, n: int, features: int = 1024) -> Case:
    rows = max(1, n // features)
    arrays = [rand((rows, features), 0), rand((1, features), 1)]
    elements = rows * features
    case = Case(
        "bias_gelu",
        f"gelu(x + b), x ({rows}, {features}), b (1, {features})",
        elements,
        # fwd: read x, write out. bwd: read x, upstream, write gx (gb is a reduction of that).
        {"fwd": 8 * elements, "fwd+bwd": (8 + 12) * elements},
        _netcl_variants(workloads.bias_gelu, arrays, device, (rows, features)),
        arrays,
    )
    x, b = arrays
    k, c = np.float32(0.7978845608028654), np.float32(0.044715)
    case.runners["numpy"] = {"fwd": lambda: _gelu_numpy(x + b, k, c)}
    return case


def _gelu_numpy(v: np.ndarray, k: np.float32, c: np.float32) -> np.ndarray:
    return np.float32(0.5) * v * (np.float32(1) + np.tanh(k * (v + c * v * v * v)))


def mlp_block_case(device: Device, n: int, inner: int = 64, features: int = 256) -> Case:
    rows = max(1, n // features)
    arrays = [rand((rows, inner), 0, -1, 1), rand((inner, features), 1, -0.2, 0.2), rand((1, features), 2)]
    elements = rows * features
    case = Case(
        "mlp_block",
        f"relu(x @ w + b) + 1, x ({rows}, {inner}), w ({inner}, {features})",
        elements,
        # fwd: read x and w, write the output (the epilogue runs in the GEMM's store). fwd+bwd: also
        # save the product, read it and the upstream gradient back, read x again and write dx.
        {
            "fwd": (rows * inner + inner * features + elements) * F32,
            "fwd+bwd": (rows * inner * 3 + inner * features + 4 * elements) * F32,
        },
        _netcl_variants(workloads.mlp_block, arrays, device, (rows, features)),
        arrays,
    )
    x, w, b = arrays
    case.runners["numpy"] = {"fwd": lambda: np.maximum(x @ w + b, np.float32(0)) + np.float32(1)}
    return case


def detection_loss_case(device: Device, n: int) -> Case | None:
    try:
        from netcl.jit.training_compiler import fused_weighted_bce_smooth_l1_loss
    except ImportError:
        return None
    pred = rand((n,), 0, -6, 6)
    target = (rand((n,), 1, 0, 1) > 0.7).astype(np.float32)
    heat_w = rand((n,), 2, 0, 1)
    reg_w = rand((n,), 3, 0, 1)
    arrays = [pred, target, heat_w, reg_w]
    scales = (1.5, 0.5, 0.05)

    def fused(p, t, hw, rw):
        return fused_weighted_bce_smooth_l1_loss(p, t, hw, rw, *scales)

    def unfused(p, t, hw, rw):
        heat, reg, beta = scales
        return heat * ag.sum(ag.weighted_bce(p, t, hw)) + reg * ag.sum(ag.weighted_smooth_l1(p, t, rw, beta))

    plain = _leaves(arrays, device, False)
    trained = _leaves(arrays[:1], device, True) + plain[1:]  # gradient w.r.t. pred only
    case = Case(
        "detection_loss",
        "weighted BCE + weighted smooth-L1, summed (4 inputs, scalar output)",
        n,
        # fwd: read 4 inputs. bwd: read 4 inputs, write grad.
        {"fwd": 16 * n, "fwd+bwd": (16 + 20) * n},
        {
            "netcl fused": {"fwd": _forward(fused, plain), "fwd+bwd": _forward_backward(fused, trained, None)},
            "netcl unfused": {
                "fwd": _forward(unfused, plain),
                "fwd+bwd": _forward_backward(unfused, trained, None),
            },
        },
        arrays,
    )
    case.runners["numpy"] = {"fwd": lambda: _detection_numpy(*arrays, *scales)}
    return case


def _detection_numpy(p, t, hw, rw, heat, reg, beta):
    bce = np.maximum(p, 0) - p * t + np.log1p(np.exp(-np.abs(p)))
    d = np.abs(p - t)
    sl1 = np.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta)
    return heat * np.sum(hw * bce, dtype=np.float64) + reg * np.sum(rw * sl1, dtype=np.float64)


def _row_case(name: str, device: Device, n: int, fused_fn, unfused_fn, eager_fn, numpy_fn, params: int) -> Case:
    """A (rows, 1024) row workload: the fused jit kernel, the composed ops, the eager row op, a copy."""
    features = 1024
    rows = max(1, n // features)
    arrays = [rand((rows, features), 0)] + [rand((features,), 1 + k, 0.5, 1.5) for k in range(params)]
    elements = rows * features
    variants = _netcl_variants(fused_fn, arrays, device, (rows, features))
    eager = _netcl_variants(eager_fn, arrays, device, (rows, features))["netcl unfused"]
    variants["netcl unfused"] = _netcl_variants(unfused_fn, arrays, device, (rows, features))["netcl unfused"]
    variants["netcl row op"] = eager
    source = ag.tensor(arrays[0], device=device).value
    variants["tensor copy"] = {"fwd": lambda: rops.copy(source)}
    case = Case(
        name,
        f"{name} over the last axis of ({rows}, {features})" + (", weight and bias (1024,)" if params else ""),
        elements,
        # fwd: read x, write y. bwd: read x and the upstream gradient, write gx (weight grads: small).
        {"fwd": 8 * elements, "fwd+bwd": (8 + 12) * elements},
        variants,
        arrays,
    )
    case.runners["numpy"] = {"fwd": lambda: numpy_fn(*arrays)}
    return case


def _softmax_composed(x):
    e = ag.exp(x - ag.max(x, -1, keepdims=True))
    return e / ag.sum(e, -1, keepdims=True)


def _softmax_numpy(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_case(device: Device, n: int) -> Case:
    return _row_case(
        "softmax",
        device,
        n,
        lambda x: ag.softmax(x, -1),
        _softmax_composed,
        lambda x: ag.softmax(x, -1),
        _softmax_numpy,
        0,
    )


def _layer_norm_composed(x, w, b):
    mu = ag.mean(x, -1, keepdims=True)
    d = x - mu
    return d * ag.rsqrt(ag.mean(d * d, -1, keepdims=True) + 1e-5) * w + b


def _layer_norm_numpy(x, w, b):
    mu = x.mean(axis=-1, keepdims=True)
    d = x - mu
    return d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + np.float32(1e-5)) * w + b


def layer_norm_case(device: Device, n: int) -> Case:
    def layer_norm(x, w, b):
        return ag.layer_norm(x, x.shape[-1], w, b)

    return _row_case("layer_norm", device, n, layer_norm, _layer_norm_composed, layer_norm, _layer_norm_numpy, 2)


def all_cases(device: Device, n: int, only: list[str] | None = None) -> list[Case]:
    """Every registered workload (or those named in ``only``) that can run on ``device``."""
    unknown = sorted(set(only or ()) - set(WORKLOADS))
    if unknown:
        raise SystemExit(f"unknown workload(s) {unknown}; registered: {list(WORKLOADS)}")
    built = (builder(device, n) for name, builder in WORKLOADS.items() if not only or name in only)
    return [case for case in built if case is not None]


register_workload("chain8", chain8_case)
register_workload("bias_gelu", bias_gelu_case)
register_workload("mlp_block", mlp_block_case)
register_workload("detection_loss", detection_loss_case)
register_workload("softmax", softmax_case)
register_workload("layer_norm", layer_norm_case)
