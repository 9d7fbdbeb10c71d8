"""The ``conv`` workload: ResNet-style 3x3 convolutions, netcl's Winograd and implicit GEMM vs im2col vs cuDNN.

Run alone (``python benchmarks/bench_conv.py [--quick] [--device SPEC]``) or as
``hatch run bench --workload conv``. Each layer is x (64, C, S, S) conv w (C, C, 3, 3), padding 1,
stride 1, no bias (64x56x56, 128x28x28, 256x14x14), timed forward and forward + both backwards
(input and weight gradient), as the median device time of one call: netcl's default path (for
these layers Winograd F(2x2, 3x3) in all three passes, ``conv_winograd``), the implicit GEMM alone
(``conv_implicit``, ``winograd=False``), Winograd F(4x4, 3x3) (``winograd=4``: faster, several times the
rounding error), netcl's im2col + matmul path (``implicit=False``), and, when torch sees CUDA on an
NVIDIA OpenCL device, cuDNN through torch in fp32 (TF32 off, ``cudnn.benchmark`` on). TFLOP/s
count 2 * N * O * C * 9 * OH * OW per pass (x3 for fwd+bwd). The netcl parts (fwd, dx, dw) are
timed alone too, and every result is checked against the im2col path and cuDNN (max error
relative to the largest magnitude). ``--quick``: small shapes for a CPU device. The GEMMs search
their tiles at first use as ``NETCL_TUNE`` says; the im2col path's products run with the search
off unless ``--tune-im2col`` (its many GEMM shapes cost minutes of builds). On tensor cores netcl
also runs at precision "tf32x3" (its default there: Winograd F(4x4, 3x3) with the products as three
tf32 products each, the fp32 implicit GEMM's accuracy; compared with cuDNN fp32) and "high" (tf32;
for these layers the same F(4x4) on tf32x3 products where the tensor cores take tf32x3, else the
implicit GEMM on tf32; compared with cuDNN TF32).
"""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_matmul import _median_ms, _rand, _torch, _torch_ms
from measure import standalone_parser, write_results

import netcl.core as nc
from netcl.runtime import tune
from netcl.runtime.ops import at_matmul_precision, conv, conv_implicit, gemm_mma
from netcl.runtime.ops.linalg import matmul

#: (label, batch, channels, image side)
LAYERS = [("c64x56", 64, 64, 56), ("c128x28", 64, 128, 28), ("c256x14", 64, 256, 14)]
QUICK = [("c8x16", 2, 8, 16), ("c16x8", 2, 16, 8)]


def _netcl_calls(x, w, g, geo, implicit: bool, precision: str = "highest", winograd: bool | int | None = None) -> dict:
    """The three passes (and all three) under matmul ``precision``."""
    under = functools.partial(at_matmul_precision, precision)
    parts = {
        "fwd": under(lambda: conv.conv2d(x, w, None, 1, 1, implicit=implicit, winograd=winograd)),
        "dx": under(lambda: conv.conv2d_backward_input(g, w, geo, 1, implicit=implicit, winograd=winograd)),
        "dw": under(lambda: conv.conv2d_backward_weight(g, x, w.shape, geo, 1, implicit=implicit)),
    }
    parts["fwd+bwd"] = lambda: [parts[k]() for k in ("fwd", "dx", "dw")]
    return parts


def _sweep(device, geo, out_ch: int) -> None:
    """Every candidate tile of each implicit kernel, timed (best of 3): what the search chooses from."""
    for kind in ("fwd", "dx", "dw"):
        layer = conv_implicit._Layer(kind, device, geo, out_ch, np.dtype(np.float32), False)
        cells = []
        for cfg in conv_implicit.candidates(layer):
            _, ms = tune.search(device, [cfg], layer)
            cells.append(f"{cfg.bm}x{cfg.bn}x{cfg.bk}/{cfg.tm}x{cfg.tn} {ms:.3f}")
        layer.scratch = None
        print(f"{'':<9}sweep {kind}: " + ", ".join(cells), flush=True)


def _im2col_parts(x, w, geo, device, repeats) -> str:
    """The im2col path's forward split: the im2col kernel, and its product alone."""
    cols = conv.im2col(x, geo).reshape(geo.N, 1, geo.C * 9, geo.OH * geo.OW)
    w3 = w.reshape(1, w.shape[0], geo.C * 9)
    t_cols = _median_ms(lambda: conv.im2col(x, geo), repeats, device.queue)
    t_mm = _median_ms(lambda: matmul(w3, cols), repeats, device.queue)
    return f"im2col fwd = im2col {t_cols:.3f} ms + matmul {t_mm:.3f} ms"


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - want)) / max(np.max(np.abs(want)), 1e-30))


def _torch_row(torch, x_host, w_host, g_host, flops, repeats, tf32: bool = False) -> tuple[dict, list[np.ndarray]]:
    import torch.nn.functional as F

    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    x = torch.from_numpy(x_host).cuda().requires_grad_(True)
    w = torch.from_numpy(w_host).cuda().requires_grad_(True)
    g = torch.from_numpy(g_host).cuda()

    def fwd():
        with torch.no_grad():
            return F.conv2d(x, w, None, 1, 1)

    def both():
        y = F.conv2d(x, w, None, 1, 1)
        return torch.autograd.grad(y, (x, w), g)

    out = {}
    for name, fn, fl in (("fwd", fwd, flops), ("fwd+bwd", both, 3 * flops)):
        ms = _torch_ms(torch, fn, repeats)
        out[name] = {"ms": ms, "tflops": fl / ms / 1e9}
    y = fwd()
    dx, dw = both()
    return out, [t.detach().cpu().numpy().astype(np.float64) for t in (y, dx, dw)]


def run(
    device_spec: str | None = None,
    quick: bool = False,
    repeats: int | None = None,
    peers: bool = True,
    tune_im2col: bool = False,
    sweep: bool = False,
) -> dict:
    device = nc.get_device(device_spec)
    repeats = repeats or (3 if quick else 10)
    torch = _torch() if peers and device.kind == "opencl" and device.is_gpu else None
    #: (variant, matmul precision, peer key, peer name) of the tensor-core modes the device probed
    tensor_modes = [
        m
        for m in (("tf32x3", "tf32x3", "peer", "cuDNN fp32"), ("tf32", "high", "peer_tf32", "cuDNN TF32"))
        if device.kind == "opencl" and gemm_mma.available(device, m[0])
    ]
    print(f"conv on {device!r}; torch peer: {torch.__version__ + ' (cuDNN fp32, TF32 off)' if torch else 'none'}")
    results: dict = {"device": repr(device), "rows": []}
    header = (
        f"{'layer':<9}{'pass':<9}{'netcl':>10}{'implicit':>10}{'im2col':>10}{'cuDNN':>10}"
        f"{'netcl/cuDNN':>12}{'impl/cuDNN':>12}   (TFLOP/s; ms: netcl / implicit / im2col / cuDNN)"
    )
    print(header)
    print("-" * len(header))
    for label, n, c, s in QUICK if quick else LAYERS:
        x_host, w_host = _rand((n, c, s, s), 1), (_rand((c, c, 3, 3), 2) / np.sqrt(9 * c)).astype(np.float32)
        g_host = _rand((n, c, s, s), 3)
        flops = 2.0 * n * c * c * 9 * s * s
        x, w, g = (nc.tensor(a, device=device) for a in (x_host, w_host, g_host))
        geo = conv.check_conv2d(x.shape, w.shape, None, 1, 1, 1, 1)
        row: dict = {"layer": label, "shape": [n, c, s, s], "netcl": {}, "im2col": {}, "peer": {}, "error": {}}
        outs = {}
        variants = [("netcl", True, "highest", None), ("implicit", True, "highest", False)]
        variants += [("wino4", True, "highest", 4)] if device.kind == "opencl" else []
        variants += [("im2col", False, "highest", None)]
        variants += [(mode, True, precision, None) for mode, precision, _, _ in tensor_modes]
        for variant, implicit, precision, winograd in variants:
            parts = _netcl_calls(x, w, g, geo, implicit, precision, winograd)
            row.setdefault(variant, {})
            saved = os.environ.get("NETCL_TUNE")
            if not implicit and not tune_im2col:
                os.environ["NETCL_TUNE"] = "0"
            start = time.perf_counter()
            outs[variant] = [parts[k]().to_host() for k in ("fwd", "dx", "dw")]  # builds (and tunes)
            row[variant]["first_call_s"] = time.perf_counter() - start
            if saved is None:
                os.environ.pop("NETCL_TUNE", None)
            else:
                os.environ["NETCL_TUNE"] = saved
            for name, fn in parts.items():
                ms = _median_ms(fn, repeats, device.queue if device.kind == "opencl" else None)
                fl = 3 * flops if name == "fwd+bwd" else flops
                row[variant][name] = {"ms": ms, "tflops": fl / ms / 1e9}
        for k, part in enumerate(("fwd", "dx", "dw")):
            row["error"][f"{part} vs im2col"] = _rel(outs["netcl"][k], outs["im2col"][k].astype(np.float64))
        if torch:
            row["peer"], ref = _torch_row(torch, x_host, w_host, g_host, flops, repeats)
            for variant in ("netcl", "implicit", "wino4"):  # (peers only on OpenCL GPUs: wino4 ran)
                for k, part in enumerate(("fwd", "dx", "dw")[: 3 if variant == "netcl" else 2]):
                    row["error"][f"{variant} {part} vs cuDNN"] = _rel(outs[variant][k], ref[k])
            if any(m[2] == "peer_tf32" for m in tensor_modes):
                row["peer_tf32"], _ = _torch_row(torch, x_host, w_host, g_host, flops, repeats, tf32=True)
        for mode, _, _, _ in tensor_modes:
            for k, part in enumerate(("fwd", "dx", "dw")):
                row["error"][f"{mode} {part} vs fp32"] = _rel(outs[mode][k], outs["netcl"][k].astype(np.float64))
        for name in ("fwd", "fwd+bwd"):
            mine, imp, old = (row[v][name] for v in ("netcl", "implicit", "im2col"))
            peer = row["peer"].get(name)
            cells = [f"{v['tflops']:>10.3g}" for v in (mine, imp, old)]
            cells.append(f"{peer['tflops']:>10.3g}" if peer else " " * 10)
            ratios = [f"{v['tflops'] / peer['tflops']:>11.2f}x" if peer else " " * 12 for v in (mine, imp)]
            times = " / ".join(f"{v['ms']:.3f}" for v in (mine, imp, old, peer) if v)
            print(f"{label:<9}{name:<9}{''.join(cells)}{''.join(ratios)}   {times}")
        if "wino4" in row:
            four, peer = row["wino4"], row["peer"]
            cells = []
            for name in ("fwd", "fwd+bwd"):
                ratio = f" ({four[name]['tflops'] / peer[name]['tflops']:.2f}x cuDNN)" if peer else ""
                cells.append(f"{name} {four[name]['tflops']:.1f} TFLOP/s ({four[name]['ms']:.3f} ms){ratio}")
            print(f"{'':<9}Winograd F(4x4, 3x3): " + "; ".join(cells))
        for mode, _, peer_key, peer_name in tensor_modes:
            cells = []
            for name in ("fwd", "fwd+bwd"):
                mine, peer = row[mode][name], row.get(peer_key, {}).get(name)
                ratio = f"{mine['tflops'] / peer['tflops']:.2f}x" if peer else ""
                versus = f" vs {peer_name} {peer['tflops']:.1f} ({ratio})" if peer else ""
                cells.append(f"{name} {mine['tflops']:.1f} TFLOP/s ({mine['ms']:.3f} ms){versus}")
            # precision "high" runs 3x3 stride-1 layers as F(4x4) on tf32x3 where the tensor cores take it
            three = any(m[0] == "tf32x3" for m in tensor_modes)
            path = {"tf32x3": "Winograd F(4x4)", "tf32": "Winograd F(4x4) as tf32x3" if three else "implicit"}[mode]
            print(f"{'':<9}{mode} ({path} on tensor cores): " + "; ".join(cells))
        split = ", ".join(f"{k} {row['netcl'][k]['ms']:.3f} ms ({row['netcl'][k]['tflops']:.1f})" for k in ("dx", "dw"))
        errs = ", ".join(f"{k} {v:.1e}" for k, v in row["error"].items())
        tiles = ", ".join(
            f"{key.split('|')[0][5:]} {cfg.short()}"
            for key, cfg in conv_implicit.CHOSEN.items()
            if f"|{c}|[{c}, {s}, {s}," in key
        )
        row["tiles"] = tiles
        print(f"{'':<9}netcl parts: {split}; first call {row['netcl']['first_call_s']:.1f} s; tiles {tiles}")
        print(f"{'':<9}error {errs}", flush=True)
        if device.kind == "opencl":
            print(f"{'':<9}{_im2col_parts(x, w, geo, device, repeats)}")
        if sweep and device.kind == "opencl":
            _sweep(device, geo, c)
        results["rows"].append(row)
        del x, w, g
    return results


def main() -> None:
    parser = standalone_parser(__doc__)
    parser.add_argument("--tune-im2col", action="store_true", help="let the im2col path's products search too")
    parser.add_argument("--sweep", action="store_true", help="time every candidate tile of the implicit kernels")
    args = parser.parse_args()
    results = run(args.device, args.quick, args.repeats, not args.no_peers, args.tune_im2col, args.sweep)
    write_results(results, args.json_path)


if __name__ == "__main__":
    main()
