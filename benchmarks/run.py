"""`hatch run bench`: fused vs un-fused netcl vs NumPy (and torch when importable), one table per workload.

Times are medians of repeats with their min-max spread: device time from OpenCL profiling
events where the device is OpenCL (program builds excluded), wall-clock on the NumPy backend.
Effective GB/s is over the minimum bytes the workload must move; "% copy" compares that with
this device's copy bandwidth measured in the same run. Each workload ends with a verdict line:
how fused compares with every other variant and, where it loses, the reason this run measured
(per-kernel device times of one call, launch counts, overlapping spreads). The header names the
device and why it was chosen; a line says which peers ran and how to enable the skipped ones.
Workloads are registered in cases.py (``register_workload``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import main

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats (under two minutes on PoCL)")
    parser.add_argument("--device", default=None, help="NETCL_DEVICE-style spec: gpu, opencl, cpu, P:D")
    parser.add_argument("--size", type=int, default=None, help="elements per tensor (default: scales with device)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per measurement")
    parser.add_argument("--json", dest="json_path", default=None, help="write all results to this JSON file")
    parser.add_argument("--plot", dest="plot_path", default=None, help="write a bar chart PNG (needs matplotlib)")
    parser.add_argument("--no-peers", action="store_true", help="skip torch even when importable")
    parser.add_argument(
        "--only",
        nargs="+",
        default=None,
        metavar="WORKLOAD",
        help="run only these workloads (train: the steps whose name contains one of these strings; matmul: the "
        "shapes whose label does)",
    )
    parser.add_argument(
        "--workload",
        choices=["fused", "matmul", "conv", "train", "launch", "input", "transformer", "trainer", "eager"],
        default="fused",
        help="matmul/conv/train/input/transformer/trainer/eager: bench_<name>.py; "
        "launch: launch_cost.py (jit call vs raw launch, replay per kernel)",
    )
    parser.add_argument(
        "--matmul-precision",
        choices=["highest", "high"],
        default="highest",
        help="float32 products on both sides: fp32 (default) or tf32 tensor cores (netcl and torch alike)",
    )
    parser.add_argument("--sweep", action="store_true", help="conv: time every candidate tile of the implicit kernels")
    parser.add_argument(
        "--profile",
        dest="profile_path",
        default=None,
        metavar="PATH",
        help="fused workloads: write a Chrome trace (netcl.profiler) of one call of each netcl variant and mode "
        "of each workload, the calls whose per-kernel lines the report prints, and print their top kernels",
    )
    parser.add_argument("--tune-im2col", action="store_true", help="conv: let the im2col path's products search too")
    args = parser.parse_args()
    if args.workload == "matmul":
        from bench_matmul import check_only

        check_only(parser, args.quick, args.only)
    if args.profile_path and args.workload != "fused":
        parser.error(f"--profile traces the fused workloads' calls; --workload {args.workload} has no per-call pass")
    if args.matmul_precision != "highest":
        from netcl.runtime.ops import set_float32_matmul_precision

        set_float32_matmul_precision(args.matmul_precision)
        try:
            import torch

            torch.set_float32_matmul_precision(args.matmul_precision)
        except ImportError:
            pass
        print(f"float32 matmul precision: {args.matmul_precision} (netcl and torch)")
    if args.workload == "matmul":
        from bench_matmul import run as run_matmul

        results = run_matmul(args.device, args.quick, args.repeats, not args.no_peers, args.only)
    elif args.workload == "launch":
        from launch_cost import run as run_launch

        results = run_launch(args.device, args.quick)
    elif args.workload == "conv":
        from bench_conv import run as run_conv

        results = run_conv(args.device, args.quick, args.repeats, not args.no_peers, args.tune_im2col, args.sweep)
    elif args.workload == "train":
        from bench_train import run as run_train

        results = run_train(args.device, args.quick, args.repeats, not args.no_peers, args.only)
    elif args.workload == "transformer":
        from bench_transformer import run as run_transformer

        results = run_transformer(args.device, args.quick, args.repeats, not args.no_peers)
    elif args.workload == "input":
        from bench_input import run as run_input

        results = run_input(args.device, args.quick, args.repeats)
    elif args.workload == "eager":
        from bench_eager import run as run_eager

        results = run_eager(args.device, args.quick, args.repeats, not args.no_peers)
    elif args.workload == "trainer":
        from bench_trainer import run as run_trainer

        results = run_trainer(args.device, args.quick, args.repeats)
    else:
        results = main(args)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(results, indent=2))
        print(f"wrote {args.json_path}")
