"""``python -m netcl.core``: print the device report (exit status 1 when NETCL_DEVICE names no device)."""

import sys

from netcl.core.report import device_report

report = device_report()
print(report)
sys.exit(1 if "\nno default device: " in report else 0)
