"""``synchronize``: wait for a device (``torch.cuda.synchronize``) and raise what its kernels recorded."""

from __future__ import annotations

from netcl.core import Device, get_device


def synchronize(device: Device | str | None = None) -> None:
    """Block until every command on ``device``'s default queue has finished.

    ``IndexError`` when a kernel recorded an out-of-range index since the last wait
    (``netcl.core.device_errors``). A no-op on the NumPy backend, which runs each op when it is called.
    """
    device = get_device(device)
    if device.queue is not None:
        device.error_word.check(device.queue)
