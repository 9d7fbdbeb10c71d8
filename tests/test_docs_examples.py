"""Every python code block of docs/*.md and README.md runs as written, on the default device.

A page's blocks run in order in one namespace (a later block may use an earlier one's names), in
a temporary working directory (examples that save a checkpoint write there). A block that cannot
run in the test suite (it needs ``mpiexec``, a GPU, or names defined elsewhere) is fenced as
````` ```python no-run `````: the marker is visible in the page, and ``NO_RUN_LIMIT`` keeps such
blocks few. Any other word after ``python`` in a fence is an error, so a typo cannot skip a block.
Primitives an example registers are removed afterwards, and the process-wide switches an example turns
(``use_deterministic_algorithms``, the float32 matmul precision) are put back, so they do not leak into other
tests (a page that left the deterministic mode on made later tests in its process skip their searches).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
NO_RUN = "no-run"
NO_RUN_LIMIT = 2  # across all pages: a no-run block is an exception, not a habit
_FENCE = re.compile(r"^```python(?P<info>[^\n]*)\n(?P<body>.*?)^```[ \t]*$", flags=re.S | re.M)


def python_blocks(text: str) -> list[tuple[str, str, int]]:
    """(info string after ``python``, code, line number of the fence) of every python block."""
    return [
        (m.group("info").strip(), m.group("body"), text.count("\n", 0, m.start()) + 1) for m in _FENCE.finditer(text)
    ]


def test_fence_parser_reads_info_strings_and_bodies() -> None:
    text = "a\n```python\nx = 1\n```\ntext\n```python no-run\ny = 2\n```\n```bash\nls\n```\n"
    assert python_blocks(text) == [("", "x = 1\n", 2), ("no-run", "y = 2\n", 6)]


def test_no_run_blocks_are_few_and_every_marker_is_known() -> None:
    no_run = []
    for page in PAGES:
        for info, _, line in python_blocks(page.read_text()):
            assert info in ("", NO_RUN), f"{page.name}:{line}: unknown fence marker {info!r} (use '{NO_RUN}' or none)"
            if info == NO_RUN:
                no_run.append(f"{page.name}:{line}")
    assert len(no_run) <= NO_RUN_LIMIT, f"too many no-run blocks: {no_run}"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_page_examples_run(page: Path, tmp_path, monkeypatch) -> None:
    blocks = [(body, line) for info, body, line in python_blocks(page.read_text()) if info != NO_RUN]
    if not blocks:
        pytest.skip(f"{page.name} has no runnable python block")
    from netcl.jit.primitive_registry import PRIMITIVES
    from netcl.runtime import determinism
    from netcl.runtime.ops.precision import get_float32_matmul_precision, set_float32_matmul_precision

    registered = dict(PRIMITIVES)
    deterministic = (
        determinism.are_deterministic_algorithms_enabled(),
        determinism.is_deterministic_algorithms_warn_only_enabled(),
    )
    precision = get_float32_matmul_precision()
    # run from a scratch directory that has the repository's examples/ as a neighbour: a page may import
    # an example's module as a user in the repository does (sys.path.insert(0, "examples"))
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    namespace = {"__name__": f"docs_{page.stem.replace('-', '_')}"}
    try:
        for body, line in blocks:
            # padded so that a traceback's line numbers are the page's
            exec(compile("\n" * line + body, str(page), "exec"), namespace)
    finally:
        for name in set(PRIMITIVES) - set(registered):
            PRIMITIVES.pop(name)
        determinism.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
        set_float32_matmul_precision(precision)
