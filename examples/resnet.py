"""CIFAR-style ResNets (32x32 inputs) written with ``netcl.nn`` as a PyTorch user would, and their torch twins.

``BasicBlock`` follows torchvision's: conv3x3(stride)-bn-relu-conv3x3-bn, plus the input (or, when
the stride or the width changes, a 1x1 strided convolution + batch norm in ``downsample``), relu.
``ResNet`` is a 3x3 stem (conv-bn-relu, stride 1, no max pool), stages of basic blocks, global
average pooling and a linear classifier. The state-dict keys are torchvision's (``conv1.weight``,
``layer2.0.downsample.0.weight``, ``bn1.running_mean``, ``fc.bias``), so ``torch_resnet`` builds the
same network in torch and ``load_state_dict`` moves the weights between the two either way.

- ``resnet8``: stem, three basic blocks (one per stage), each stride 2 with a 1x1 shortcut convolution;
- ``resnet18``: stem, four stages of two basic blocks (64, 128, 256, 512 channels; strides 1, 2, 2, 2).

``width`` scales every channel count (the benchmarks use a narrow copy off a GPU).

Run: ``python examples/resnet.py [--device cpu]`` prints both models' parameter counts and one SGD
step's loss on random data.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import numpy as np

import netcl.autograd as ag
import netcl.nn as nn

#: (blocks per stage, channels per stage, stride of each stage's first block) at width 1
RESNET8 = ((1, 1, 1), (64, 128, 256), (2, 2, 2))
RESNET18 = ((2, 2, 2, 2), (64, 128, 256, 512), (1, 2, 2, 2))


def stage_widths(channels: Sequence[int], width: float) -> list[int]:
    """Each stage's channel count scaled by ``width`` (rounded, at least 1)."""
    return [max(1, round(c * width)) for c in channels]


class BasicBlock(nn.Module):
    """relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)); ``conv1`` has the stride. The shortcut is
    the identity when the stride is 1 and the width stays, else ``downsample`` (conv1x1(stride) + bn)."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1, device: Any = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False, device=device)
        self.bn1 = nn.BatchNorm2d(planes, device=device)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False, device=device)
        self.bn2 = nn.BatchNorm2d(planes, device=device)
        if stride != 1 or in_planes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False, device=device),
                nn.BatchNorm2d(planes, device=device),
            )
        else:
            self.downsample = None

    def forward(self, x: Any) -> Any:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    """(N, 3, H, W) -> (N, num_classes) logits: 3x3 stem, ``layer1..layerK`` of basic blocks, global
    average pooling, ``fc``."""

    def __init__(
        self,
        blocks: Sequence[int],
        channels: Sequence[int],
        strides: Sequence[int],
        num_classes: int = 10,
        width: float = 1.0,
        device: Any = None,
    ) -> None:
        super().__init__()
        if not (len(blocks) == len(channels) == len(strides)) or not blocks:
            raise ValueError(
                f"ResNet: blocks {tuple(blocks)}, channels {tuple(channels)} and strides {tuple(strides)} "
                "must be non-empty and of one length (one entry per stage)"
            )
        if width <= 0:
            raise ValueError(f"ResNet: width must be positive, got {width}")
        widths = stage_widths(channels, width)
        stem = widths[0]
        self.conv1 = nn.Conv2d(3, stem, 3, padding=1, bias=False, device=device)
        self.bn1 = nn.BatchNorm2d(stem, device=device)
        self.relu = nn.ReLU()
        in_planes = stem
        for i, (count, planes, stride) in enumerate(zip(blocks, widths, strides, strict=True)):
            layer = []
            for j in range(count):
                layer.append(BasicBlock(in_planes, planes, stride if j == 0 else 1, device=device))
                in_planes = planes
            setattr(self, f"layer{i + 1}", nn.Sequential(*layer))
        self.num_stages = len(blocks)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_planes, num_classes, device=device)

    def forward(self, x: Any) -> Any:
        out = self.relu(self.bn1(self.conv1(x)))
        for i in range(self.num_stages):
            out = getattr(self, f"layer{i + 1}")(out)
        return self.fc(ag.flatten(self.avgpool(out), 1))


def resnet8(num_classes: int = 10, width: float = 1.0, device: Any = None) -> ResNet:
    """Stem + three stride-2 basic blocks with 1x1 shortcut convolutions (64, 128, 256 channels at width 1)."""
    return ResNet(*RESNET8, num_classes=num_classes, width=width, device=device)


def resnet18(num_classes: int = 10, width: float = 1.0, device: Any = None) -> ResNet:
    """CIFAR-style ResNet-18: stem + 2-2-2-2 basic blocks (64, 128, 256, 512 channels at width 1)."""
    return ResNet(*RESNET18, num_classes=num_classes, width=width, device=device)


def torch_resnet(torch: Any, config: tuple, num_classes: int = 10, width: float = 1.0) -> Any:
    """The same network in torch (same module names, so the same state-dict keys); ``config`` is
    ``RESNET8`` or ``RESNET18``. torch is passed in: this module does not import it."""
    tnn = torch.nn

    class TorchBlock(tnn.Module):
        def __init__(self, in_planes: int, planes: int, stride: int) -> None:
            super().__init__()
            self.conv1 = tnn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
            self.bn1 = tnn.BatchNorm2d(planes)
            self.relu = tnn.ReLU()
            self.conv2 = tnn.Conv2d(planes, planes, 3, padding=1, bias=False)
            self.bn2 = tnn.BatchNorm2d(planes)
            self.downsample = None
            if stride != 1 or in_planes != planes:
                self.downsample = tnn.Sequential(
                    tnn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), tnn.BatchNorm2d(planes)
                )

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + (x if self.downsample is None else self.downsample(x)))

    class TorchResNet(tnn.Module):
        def __init__(self) -> None:
            super().__init__()
            blocks, channels, strides = config
            widths = stage_widths(channels, width)
            stem = widths[0]
            self.conv1 = tnn.Conv2d(3, stem, 3, padding=1, bias=False)
            self.bn1 = tnn.BatchNorm2d(stem)
            self.relu = tnn.ReLU()
            in_planes = stem
            for i, (count, planes, stride) in enumerate(zip(blocks, widths, strides, strict=True)):
                layer = []
                for j in range(count):
                    layer.append(TorchBlock(in_planes, planes, stride if j == 0 else 1))
                    in_planes = planes
                setattr(self, f"layer{i + 1}", tnn.Sequential(*layer))
            self.num_stages = len(blocks)
            self.avgpool = tnn.AdaptiveAvgPool2d(1)
            self.fc = tnn.Linear(in_planes, num_classes)

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            for i in range(self.num_stages):
                out = getattr(self, f"layer{i + 1}")(out)
            return self.fc(torch.flatten(self.avgpool(out), 1))

    return TorchResNet()


def host_state(model: nn.Module) -> dict[str, np.ndarray]:
    """A host copy of ``model.state_dict()`` (e.g. to load into the torch twin before either trains)."""
    return {key: np.array(value.numpy(), copy=True) for key, value in model.state_dict().items()}


def main() -> None:
    from netcl.core import get_device
    from netcl.optim import SGD

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default=None, help="netcl device spec (default: netcl's default device)")
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    device = get_device(args.device)
    rng = np.random.default_rng(0)
    x = ag.tensor(rng.normal(size=(args.batch, 3, 32, 32)).astype(np.float32), device=device)
    y = ag.tensor(rng.integers(0, 10, args.batch).astype(np.int32), device=device)
    for name, build in (("resnet8", resnet8), ("resnet18", resnet18)):
        model = build(device=device)
        count = sum(int(np.prod(p.shape)) for p in model.parameters())
        opt = SGD(model.parameters(), lr=0.01, momentum=0.9)
        with ag.Tape() as tape:
            loss = ag.cross_entropy(model(x), y)
        tape.backward(loss)
        opt.step()
        print(f"{name}: {count} parameters, loss of one step on random data {float(loss.numpy()):.4f}")


if __name__ == "__main__":
    main()
