"""Loading a Python file of this repository as a module, once per process (the tests' shared loader).

The tests run with ``--import-mode=importlib`` and ``tests/`` on ``sys.path`` (pytest.ini's ``pythonpath``),
so test files import this module by name; the files they load (examples, reference implementations, helper
modules beside them) are not packages, hence ``load``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

#: the repository's root (examples/, tests/, benchmarks/)
ROOT = Path(__file__).resolve().parents[1]


def load(path: Path | str, name: str) -> ModuleType:
    """The module of the file ``path`` (relative paths from the repository's root) as ``sys.modules[name]``,
    executed the first time only."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path} as a module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]
