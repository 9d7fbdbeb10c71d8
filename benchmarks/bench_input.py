"""The ``input`` workload: how much of the input pipeline ``netcl.data.DataLoader`` hides.

Two measurements, each printed with its ratio:

- **copy overlap** (OpenCL devices): a loader-bound training step: large uint8 images (batch 128 of
  3x224x224 on a GPU: 19 MB a batch; batch 16 of 3x64x64 with ``--quick`` or off a GPU) through a
  small CNN (cast to float32 and scale, conv3x3/2 -> relu -> conv3x3/2 -> relu -> global mean ->
  linear, cross-entropy, SGD). Wall-clock ms per step with the batches coming from the loader
  (workers collate into pinned buffers, the copy of batch n+1 on the copy Stream while step n
  computes) against the same steps on batches already on the device. Target: ratio <= 1.1 on a
  GPU. Also the loader alone (no compute) and the device time of one batch's host-to-device copy,
  from which the share of the copy hidden behind compute: 1 - (with loader - on device) / copy.
  A GPU epoch is 32 steps (4096 images), so filling the pipeline at the start of an epoch (the first
  batch is built and copied before any step) weighs as little as in a real epoch of many steps.
- **workers** (any device): an epoch of a loader whose ``collate_fn`` is costly NumPy work
  (per image: normalize, 3x3 box filters, tanh, exp; written as whole-batch ufunc calls, which
  release the GIL), inline (``num_workers=0``) against 2 worker threads and 2 persistent worker
  processes. Target on the CPU default: 2 threads >= 1.5x inline.

Times are medians over repeats, after a warm-up epoch (programs built, pinned buffers pooled).
Run alone (``python benchmarks/bench_input.py [--quick] [--device SPEC]``) or as
``hatch run bench --workload input``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import standalone_parser, write_results

import netcl.autograd as ag
import netcl.core as nc
import netcl.nn as nn
from netcl.data import DataLoader, TensorDataset
from netcl.optim import SGD
from netcl.runtime.ops import cast

#: (images, batch, side) of the overlap case on a GPU, and with --quick or off a GPU
OVERLAP_FULL, OVERLAP_SMALL = (4096, 128, 224), (64, 16, 64)
#: (items, batch, side) of the workers case
WORKERS_FULL, WORKERS_SMALL = (512, 32, 96), (128, 32, 64)
WIDTH = 44


def _is_gpu(device: nc.Device) -> bool:
    import pyopencl as cl

    return device.kind == "opencl" and bool(device.cl_device.type & cl.device_type.GPU)


def _sync(device: nc.Device) -> Callable[[], None]:
    return device.queue.finish if device.kind == "opencl" else (lambda: None)


class SmallCNN(nn.Module):
    """uint8 images -> float32 / 255 -> conv3x3/2 (16) -> relu -> conv3x3/2 (32) -> relu -> mean -> linear."""

    def __init__(self, device: nc.Device) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, stride=2, padding=1, device=device)
        self.conv2 = nn.Conv2d(16, 32, 3, stride=2, padding=1, device=device)
        self.head = nn.Linear(32, 10, device=device)

    def forward(self, images):
        x = cast(images, np.float32) * (1.0 / 255.0)
        x = ag.relu(self.conv2(ag.relu(self.conv1(x))))
        return self.head(ag.mean(x, axis=(2, 3)))


def _workers() -> int:
    """Worker threads for the overlap case: ``NETCL_BENCH_INPUT_WORKERS``, else half the CPUs, between 2 and 8."""
    chosen = os.environ.get("NETCL_BENCH_INPUT_WORKERS")
    if chosen:
        return int(chosen)
    return max(2, min(8, (os.cpu_count() or 2) // 2))


def _copy_ms(device: nc.Device, nbytes: int) -> float:
    """Device time of one host-to-device copy of ``nbytes`` from pinned memory (median of 5, profiling events)."""
    import pyopencl as cl

    from netcl.data.pinned import PinnedBuffer
    from netcl.runtime.scheduler import Stream

    stream = Stream(device=device)
    host = PinnedBuffer(nbytes, stream.queue)
    target = nc.Tensor.empty((nbytes,), np.uint8, device)
    samples = []
    for _ in range(6):
        event = cl.enqueue_copy(stream.queue, target.data, host.host[:nbytes], is_blocking=False)
        event.wait()
        samples.append((event.profile.end - event.profile.start) * 1e-6)
    return statistics.median(samples[1:])


def overlap(device: nc.Device, quick: bool, repeats: int) -> dict:
    count, batch, side = OVERLAP_FULL if _is_gpu(device) and not quick else OVERLAP_SMALL
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (count, 3, side, side), dtype=np.uint8)
    labels = rng.integers(0, 10, count).astype(np.int32)
    model = SmallCNN(device)
    opt = SGD(model.parameters(), lr=0.01, momentum=0.9)
    sync = _sync(device)

    def step(x, y) -> None:
        opt.zero_grad()
        with ag.Tape() as tape:
            loss = ag.cross_entropy(model(x), y)
        tape.backward(loss)
        opt.step()

    workers = _workers()
    loader = DataLoader(
        TensorDataset(images, labels), batch_size=batch, shuffle=True, seed=0, num_workers=workers, device=device
    )
    resident = [
        (nc.Tensor.from_host(device, images[i : i + batch]), nc.Tensor.from_host(device, labels[i : i + batch]))
        for i in range(0, count, batch)
    ]

    def per_step(run_epoch: Callable[[], int]) -> float:
        run_epoch()  # warm-up
        sync()
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            steps = run_epoch()
            sync()
            samples.append((time.perf_counter() - start) * 1e3 / steps)
        return statistics.median(samples)

    def on_device() -> int:
        for x, y in resident:
            step(x, y)
        return len(resident)

    def with_loader() -> int:
        steps = 0
        for x, y in loader:
            step(x, y)
            steps += 1
        return steps

    def loader_alone() -> int:
        return sum(1 for _ in loader)

    t_device = per_step(on_device)
    t_loader = per_step(with_loader)
    t_alone = per_step(loader_alone)
    t_copy = _copy_ms(device, images[:batch].nbytes)
    ratio = t_loader / t_device
    hidden = 1.0 - max(0.0, t_loader - t_device) / t_copy if t_copy > 0 else 1.0
    name = f"batch {batch}x3x{side}x{side} uint8, {workers} threads"
    print(f"copy overlap: {name} ({images[:batch].nbytes / 2**20:.1f} MiB a batch)")
    for label, ms in [
        ("step, batch already on the device", t_device),
        ("step, batch from the loader", t_loader),
        ("loader alone (no compute)", t_alone),
        ("host-to-device copy of one batch (device)", t_copy),
    ]:
        print(f"  {label:<{WIDTH}}{ms:>10.3f} ms")
    verdict = "met" if ratio <= 1.1 else "not met"
    shown = 100 * max(0.0, min(1.0, hidden))
    print(f"  with loader / on device: {ratio:.3f} (target <= 1.1 on a GPU: {verdict}); copy hidden: {shown:.0f}%")
    return {
        "case": name,
        "ms_step_on_device": t_device,
        "ms_step_with_loader": t_loader,
        "ms_loader_alone": t_alone,
        "ms_copy": t_copy,
        "ratio": ratio,
        "hidden_share": hidden,
    }


def augment(images: np.ndarray) -> np.ndarray:
    """Per image: normalize, two 3x3 box filters each followed by tanh, then exp(-x^2).

    Every operation works on the whole batch at once (a few MB per ufunc call), so the work runs
    without the GIL and worker threads proceed in parallel; the same steps image by image (arrays of
    ~100 KB, a few microseconds per call) are dominated by the GIL hand-offs between calls.
    """
    axes = (1, 2, 3)
    x = (images - images.mean(axis=axes, keepdims=True)) / (images.std(axis=axes, keepdims=True) + 1e-5)
    h, w = x.shape[2], x.shape[3]
    for _ in range(2):
        padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), mode="edge")
        acc = padded[:, :, 0:h, 0:w].copy()
        for dy in range(3):
            for dx in range(3):
                if dy or dx:
                    acc += padded[:, :, dy : dy + h, dx : dx + w]
        x = np.tanh(acc * np.float32(1.0 / 9.0))
    return np.exp(-x * x)


def costly_collate(items: list) -> tuple[np.ndarray, np.ndarray]:
    """Stack the images and augment them (``augment``); the labels as int32."""
    images = np.stack([item[0] for item in items])
    return augment(images), np.array([item[1] for item in items], np.int32)


def workers(device: nc.Device, quick: bool, repeats: int) -> dict:
    count, batch, side = WORKERS_SMALL if quick else WORKERS_FULL
    rng = np.random.default_rng(1)
    dataset = TensorDataset(rng.random((count, 3, side, side), dtype=np.float32), np.arange(count))
    sync = _sync(device)

    def epoch_ms(**kwargs) -> float:
        loader = DataLoader(dataset, batch_size=batch, collate_fn=costly_collate, device=device, seed=0, **kwargs)
        samples = []
        for k in range(repeats + 1):
            start = time.perf_counter()
            for _ in loader:
                pass
            sync()
            if k:  # the first epoch warms up
                samples.append((time.perf_counter() - start) * 1e3)
        return statistics.median(samples)

    times = {
        "inline (num_workers=0)": epoch_ms(),
        "2 worker threads": epoch_ms(num_workers=2),
        "2 worker processes": epoch_ms(num_workers=2, worker_type="process", persistent_workers=True),
    }
    name = f"{count} items 3x{side}x{side}, batch {batch}, costly collate_fn"
    print(f"workers: {name} ({os.cpu_count()} CPUs)")
    for label, ms in times.items():
        print(f"  {label:<{WIDTH}}{ms:>10.3f} ms/epoch")
    speedup = times["inline (num_workers=0)"] / times["2 worker threads"]
    verdict = "met" if speedup >= 1.5 else "not met"
    print(
        f"  2 threads are {speedup:.2f}x inline (target >= 1.5x on the CPU default: {verdict}); "
        f"2 processes {times['inline (num_workers=0)'] / times['2 worker processes']:.2f}x"
    )
    return {"case": name, "ms_per_epoch": times, "thread_speedup": speedup}


def run(device_spec: str | None = None, quick: bool = False, repeats: int | None = None) -> dict:
    device = nc.get_device(device_spec)
    repeats = repeats or (3 if quick else 5)
    print(f"input: netcl.data.DataLoader on {device!r}")
    results: dict = {"device": repr(device)}
    if device.kind == "opencl":
        results["overlap"] = overlap(device, quick, repeats)
    else:
        print("copy overlap: skipped (the NumPy backend has no host-to-device copy; pass --device gpu or opencl)")
    results["workers"] = workers(device, quick, repeats)
    return results


def main() -> None:
    args = standalone_parser(__doc__).parse_args()
    write_results(run(args.device, args.quick, args.repeats), args.json_path)


if __name__ == "__main__":
    main()
