#!/usr/bin/env bash
# Build the wheel of each of the four distributions, then check in clean virtual environments that
#   1. installing ONLY the netcl-core wheel gives a working `netcl.core` (NumPy backend at least)
#      while `import netcl.runtime` fails with ModuleNotFoundError; with its [pocl] extra, PoCL is
#      a real OpenCL device even on a machine with no GPU driver, and
#   2. installing all four wheels resolves their pinned inter-package ranges and imports every layer.
# Dependencies (numpy, pyopencl, ...) come from the package index pip is configured with.
#
# Usage: scripts/check_wheels.sh [WORKDIR]     (default: a fresh temporary directory, removed on success)
# Environment: HATCH (hatch command), PYTHON (interpreter for the clean venvs, default python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
if [[ -z "${HATCH:-}" ]]; then
  if command -v hatch >/dev/null 2>&1; then HATCH=hatch
  elif [[ -x /tmp/venv/bin/hatch ]]; then HATCH=/tmp/venv/bin/hatch
  else HATCH="$PYTHON -m hatch"; fi
fi
WORK="${1:-$(mktemp -d -t netcl-wheels.XXXXXX)}"
DIST="$WORK/dist"
mkdir -p "$DIST"
# a clean venv must not see the workspace's editable installs or a user's NETCL_DEVICE
unset PYTHONPATH NETCL_DEVICE VIRTUAL_ENV

step() { printf '\n== %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

step "building wheels into $DIST"
for layer in core runtime autograd jit; do
  (cd "$ROOT/packages/netcl-$layer" && $HATCH build -t wheel "$DIST") || fail "hatch build of netcl-$layer"
done
ls -1 "$DIST"

step "checking wheel contents (namespace package, one layer per wheel, the MIT LICENSE)"
"$PYTHON" - "$DIST" "$ROOT" <<'EOF'
import pathlib, sys, zipfile
for wheel in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    layer = wheel.name.split("-")[0].removeprefix("netcl_")
    names = zipfile.ZipFile(wheel).namelist()
    code = [n for n in names if not n.split("/")[0].endswith(".dist-info")]
    if "netcl/__init__.py" in names:
        sys.exit(f"{wheel.name}: ships netcl/__init__.py; netcl must stay a namespace package")
    stray = [n for n in code if not n.startswith(f"netcl/{layer}/")]
    if stray:
        sys.exit(f"{wheel.name}: files outside netcl/{layer}/: {stray}")
    for needed in ("__about__.py", "py.typed"):
        if f"netcl/{layer}/{needed}" not in names:
            sys.exit(f"{wheel.name}: missing netcl/{layer}/{needed}")
    licenses = [n for n in names if n.split("/")[0].endswith(".dist-info") and n.endswith("/licenses/LICENSE")]
    root_license = (pathlib.Path(sys.argv[2]) / "LICENSE").read_bytes()
    if len(licenses) != 1 or zipfile.ZipFile(wheel).read(licenses[0]) != root_license:
        sys.exit(f"{wheel.name}: the repository's LICENSE (MIT) is not in .dist-info/licenses/: {licenses}")
    print(f"{wheel.name}: {len(code)} files under netcl/{layer}/, no netcl/__init__.py, LICENSE included")
EOF

step "clean venv with only the netcl-core wheel"
"$PYTHON" -m venv "$WORK/core-only"
CORE_PY="$WORK/core-only/bin/python"
"$CORE_PY" -m pip install --quiet --disable-pip-version-check "$DIST"/netcl_core-*.whl
"$CORE_PY" -m pip list --disable-pip-version-check 2>/dev/null | grep -iE '^(netcl|numpy|pyopencl)' || true
cd "$WORK"  # away from the repository, so nothing is imported from the source tree
"$CORE_PY" - <<'EOF'
import numpy as np
import netcl.core as nc

device = nc.get_device()
t = nc.tensor([[1.0, 2.0], [3.0, 4.0]])
assert t.dtype == nc.float32 and t.shape == (2, 2)
np.testing.assert_array_equal(t.reshape(-1).to_host(), [1, 2, 3, 4])
cpu = nc.tensor([1, 2, 3], device="cpu")
assert cpu.to_host().tolist() == [1, 2, 3]
assert nc.broadcast_shapes((4, 1), (1, 3)) == (4, 3)
from netcl.core.kernels.primitives import PRIMITIVE_PREAMBLE
assert "GELU" in PRIMITIVE_PREAMBLE
print(f"import netcl.core OK: version {nc.__version__}, default device {device!r} ({nc.default_reason()})")
EOF
"$CORE_PY" -m netcl.core | tail -n 2
set +e
ERR="$("$CORE_PY" -c "import netcl.runtime" 2>&1)"
RC=$?
set -e
[[ $RC -ne 0 ]] || fail "import netcl.runtime succeeded with only netcl-core installed"
grep -q "ModuleNotFoundError: No module named 'netcl.runtime'" <<<"$ERR" \
  || fail "import netcl.runtime failed, but not with ModuleNotFoundError: $ERR"
echo "import netcl.runtime fails as expected: $(tail -n 1 <<<"$ERR")"

step "same venv plus the netcl-core [pocl] extra: PoCL becomes the default device"
CORE_WHEEL="$(ls "$DIST"/netcl_core-*.whl)"
"$CORE_PY" -m pip install --quiet --disable-pip-version-check "${CORE_WHEEL}[pocl]"
NETCL_DEVICE=opencl "$CORE_PY" -c "
import numpy as np, netcl.core as nc
t = nc.tensor(np.arange(6.0).reshape(2, 3))
assert t.device.kind == 'opencl' and t.reshape(3, 2).to_host().tolist() == [[0, 1], [2, 3], [4, 5]]
print('OpenCL round trip OK on', t.device)
"
"$CORE_PY" -m netcl.core | grep '^default:'

step "clean venv with all four wheels"
"$PYTHON" -m venv "$WORK/all"
ALL_PY="$WORK/all/bin/python"
"$ALL_PY" -m pip install --quiet --disable-pip-version-check "$DIST"/netcl_*.whl
"$ALL_PY" -c "
import importlib, importlib.metadata as md
for layer in ('core', 'runtime', 'autograd', 'jit'):
    importlib.import_module(f'netcl.{layer}')
    print(f'import netcl.{layer} OK (netcl-{layer} {md.version(f\"netcl-{layer}\")})')
"

step "all wheel checks passed"
if [[ $# -eq 0 ]]; then rm -rf "$WORK"; fi
