"""netcl.nn / netcl.optim / netcl.amp ship with netcl-autograd and never import netcl.jit."""

from __future__ import annotations

import subprocess
import sys


def test_training_packages_do_not_import_the_jit():
    code = (
        "import sys, netcl.nn, netcl.optim, netcl.amp, netcl.nn.functional\n"
        "print(sorted(m for m in sys.modules if m.startswith('netcl.jit')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
