"""The README's "Training models" example runs as written and trains."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_training_example(tmp_path, monkeypatch, capsys):
    section = README.read_text().split("## Training models", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    monkeypatch.chdir(tmp_path)  # it writes model.safetensors to the working directory
    exec(compile(block, str(README), "exec"), {"__name__": "readme_training"})
    loss, accuracy = re.search(
        r"loss ([0-9.]+), accuracy of the reloaded model (\d+)%", capsys.readouterr().out
    ).groups()
    assert float(loss) < 0.2 and int(accuracy) >= 95
    assert (tmp_path / "model.safetensors").is_file()
