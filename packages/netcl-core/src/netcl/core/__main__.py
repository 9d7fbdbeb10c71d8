"""``python -m netcl.core``: print the device report."""

from netcl.core.report import device_report

print(device_report())
