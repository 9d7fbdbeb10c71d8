"""The ResNet-8 training step of examples/resnet.py at a narrow width, shared by the tests of the JIT's trace
rewrites: the model, SGD (momentum 0.9) and one batch made alike from a seed, the eager step, and what the
steps leave behind (losses, parameters, running statistics, gradients) as host arrays."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import file_modules
import numpy as np

import netcl.autograd as ag
from netcl.optim import SGD

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "resnet.py"
BATCH, SIZE, STEPS = 4, 16, 3


def resnet() -> Any:
    """examples/resnet.py as a module."""
    return file_modules.load(EXAMPLE, "netcl_example_resnet")


def setup(device: Any, width: float, state: dict | None = None) -> tuple[Any, Any, Any, Any]:
    """(model, optimizer, x, y): ResNet-8 at ``width`` (``state`` loaded when given) and one batch."""
    rng = np.random.default_rng(0)
    model = resnet().resnet8(width=width, device=device)
    if state is not None:
        model.load_state_dict(state)
    x = ag.tensor(rng.normal(size=(BATCH, 3, SIZE, SIZE)).astype(np.float32), device=device)
    y = ag.tensor(rng.integers(0, 10, BATCH).astype(np.int32), device=device)
    return model, SGD(model.parameters(), lr=0.1, momentum=0.9), x, y


def initial_state(device: Any, width: float) -> dict[str, np.ndarray]:
    """A fresh model's state dict on the host, for ``setup`` to load (every run from the same weights)."""
    return {k: v.to_host() for k, v in setup(device, width)[0].state_dict().items()}


def results(model: Any, losses: list[Any]) -> dict[str, np.ndarray]:
    """The losses (tensors or Nodes), the model's state and its parameters' gradients, on the host."""
    out = {f"loss{i}": np.asarray(getattr(loss, "value", loss).to_host()) for i, loss in enumerate(losses)}
    out.update({k: v.to_host() for k, v in model.state_dict().items()})
    out.update({f"{k}.grad": p.grad.to_host() for k, p in model.named_parameters()})
    return out


def eager_results(device: Any, width: float, state: dict) -> dict[str, np.ndarray]:
    """``results`` after ``STEPS`` eager training steps from ``state``."""
    model, opt, x, y = setup(device, width, state)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        with ag.Tape() as tape:
            loss = ag.cross_entropy(model(x), y)
        tape.backward(loss)
        opt.step()
        losses.append(loss)
    return results(model, losses)


def replayed_results(device: Any, width: float, state: dict) -> tuple[Any, Any, dict[str, np.ndarray]]:
    """(model, captured graph, ``results``) after ``STEPS`` steps of ``fuse_graph``'s captured step from
    ``state``: the capture's own step, then replays."""
    from netcl.jit import fuse_graph

    model, opt, x, y = setup(device, width, state)
    graph = fuse_graph(model, x, y, ag.cross_entropy, optimizer_step=opt.step)
    losses = [ag.tensor(graph.outputs.value.to_host(), device=device)]
    losses += [graph.execute(x, y, copy_outputs=True) for _ in range(STEPS - 1)]
    return model, graph, results(model, losses)
