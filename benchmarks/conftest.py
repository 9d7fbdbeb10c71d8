"""pytest-benchmark set-up: the benchmark helpers in this folder import each other by name."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
