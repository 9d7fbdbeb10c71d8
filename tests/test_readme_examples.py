"""The code examples of the package READMEs run as written (each on the default device).

netcl-runtime's example launches a kernel of its own, so it needs an OpenCL device that builds
programs; without one it is skipped (its first line would raise DeviceError saying why).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import netcl.core as nc

ROOT = Path(__file__).resolve().parents[1]
READMES = sorted((ROOT / "packages").glob("netcl-*/README.md"))


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


@pytest.mark.parametrize("readme", READMES, ids=[p.parent.name for p in READMES])
def test_package_readme_installs_from_the_repository_and_its_example_runs(readme: Path, capsys) -> None:
    text = readme.read_text()
    assert "pip install ./packages/" in text and "from this repository" in text
    blocks = _python_blocks(readme)
    assert blocks, f"{readme} has no python example"
    if 'nc.get_device("opencl")' in text and not nc.usable_opencl_devices():
        pytest.skip("the example needs an OpenCL device that builds programs; this machine has none")
    from netcl.jit.primitive_registry import PRIMITIVES

    registered = set(PRIMITIVES)
    try:
        for block in blocks:
            exec(compile(block, str(readme), "exec"), {"__name__": "readme_example"})
    finally:
        for name in set(PRIMITIVES) - registered:  # the jit example registers a primitive
            PRIMITIVES.pop(name)
    assert capsys.readouterr().out  # every example prints what it shows


def test_repository_license_is_mit_and_every_distribution_ships_it() -> None:
    license_text = (ROOT / "LICENSE").read_text()
    assert license_text.startswith("MIT License")
    for readme in READMES:
        package = readme.parent
        assert (package / "LICENSE").read_text() == license_text, f"{package.name}/LICENSE differs from LICENSE"
        assert 'license = "MIT"' in (package / "pyproject.toml").read_text()


def test_docs_point_to_the_architecture_page_not_missing_files() -> None:
    assert (ROOT / "docs" / "architecture.md").is_file()
    stale = []
    for path in [*ROOT.glob("packages/*/src/**/*.py"), *ROOT.glob("benchmarks/*"), *ROOT.glob("scripts/*")]:
        if path.is_file() and re.search(r"\b(DESIGN|DEVELOPERS)\.md\b", path.read_text(errors="ignore")):
            stale.append(str(path.relative_to(ROOT)))
    assert stale == [], f"references to DESIGN.md/DEVELOPERS.md (not in the repository): {stale}"
