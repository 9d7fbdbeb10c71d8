"""Peers measured side by side when importable: torch eager and torch.compile.

On CUDA (when the OpenCL device is an NVIDIA GPU and torch sees CUDA) times come from CUDA
events; otherwise torch runs on the CPU and is timed by wall clock.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np
from measure import Timing, time_cuda, time_wall

from netcl.core import Device


def torch_backend(device: Device):
    """(torch module, torch device string) or None when torch is not importable."""
    return torch_status(device)[0]


def torch_status(device: Device) -> tuple[tuple | None, str]:
    """((torch, "cuda" | "cpu") or None, a sentence saying which torch peers run and why)."""
    try:
        import torch
    except Exception as exc:  # any import failure means "no peer"
        return None, (
            f"torch eager and torch.compile skipped: torch is not importable ({type(exc).__name__}); "
            "pip install torch in this environment to compare with them"
        )
    nvidia = device.kind == "opencl" and device.is_gpu and "NVIDIA" in device.platform_name.upper()
    if nvidia and torch.cuda.is_available():
        return (torch, "cuda"), f"torch {torch.__version__} eager and torch.compile on CUDA (same GPU)"
    if device.kind == "opencl" and device.is_gpu:
        return None, (
            "torch eager and torch.compile skipped: this GPU is not NVIDIA/CUDA, and torch on the CPU would "
            "not be the same kind of device; run with --device cpu or opencl on a CPU to compare on the host"
        )
    return (torch, "cpu"), f"torch {torch.__version__} eager and torch.compile on the host CPU"


def _time_torch(torch, where: str, fn: Callable[[], object], repeats: int) -> Timing:
    if where != "cuda":
        return time_wall(fn, repeats)
    return time_cuda(torch, fn, repeats, warmup=3)


def _torch_fns(torch, name: str):
    F = torch.nn.functional

    def chain8(x, a, b):
        h = torch.relu(x * a + b) * 0.5
        h = torch.tanh(torch.sigmoid(h) - x)
        return h * h

    def bias_gelu(x, b):
        return F.gelu(x + b, approximate="tanh")

    def mlp_block(x, w, b):
        return torch.relu(x @ w + b) + 1.0

    def detection_loss(p, t, hw, rw, heat=1.5, reg=0.5, beta=0.05):
        bce = torch.clamp(p, min=0) - p * t + torch.log1p(torch.exp(-p.abs()))
        d = (p - t).abs()
        sl1 = torch.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta)
        return heat * (hw * bce).sum() + reg * (rw * sl1).sum()

    def softmax(x):
        return torch.softmax(x, -1)

    def layer_norm(x, w, b):
        return F.layer_norm(x, (x.shape[-1],), w, b)

    return {
        "chain8": chain8,
        "bias_gelu": bias_gelu,
        "mlp_block": mlp_block,
        "detection_loss": detection_loss,
        "softmax": softmax,
        "layer_norm": layer_norm,
    }[name]


def measure_torch(device: Device, case, repeats: int, progress: Callable[[str], None]) -> dict[str, dict[str, Timing]]:
    """torch eager and torch.compile timings for ``case``, forward and forward+backward."""
    backend = torch_backend(device)
    if backend is None:
        return {}
    torch, where = backend
    fn = _torch_fns(torch, case.name)
    trainable = [True] + [case.name != "detection_loss"] * (len(case.arrays) - 1)
    tensors = [torch.from_numpy(np.ascontiguousarray(a)).to(where) for a in case.arrays]
    leaves = [t.clone().requires_grad_(g) for t, g in zip(tensors, trainable, strict=True)]
    results: dict[str, dict[str, Timing]] = {}
    variants = [("torch eager", fn)]
    try:
        variants.append(("torch.compile", torch.compile(fn)))
    except Exception as exc:
        print(f"  torch.compile unavailable: {exc}", file=sys.stderr)
    for label, impl in variants:
        try:
            progress(f"{case.name}: {label} ({where})")
            with torch.no_grad():
                forward = _time_torch(torch, where, lambda impl=impl: impl(*tensors), repeats)
            out = impl(*leaves)
            upstream = torch.ones_like(out) if out.dim() == 0 else torch.rand_like(out)

            def step(impl=impl, upstream=upstream):
                for leaf in leaves:
                    leaf.grad = None
                impl(*leaves).backward(upstream)

            results[label] = {"fwd": forward, "fwd+bwd": _time_torch(torch, where, step, repeats)}
        except Exception as exc:  # a peer failing must not stop the run
            print(f"  {label} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    return results
