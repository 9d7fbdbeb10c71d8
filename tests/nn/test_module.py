"""netcl.nn.Module: registration, traversal, modes, devices, state dicts and their errors, repr."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.core as nc
import netcl.nn as nn


class Block(nn.Module):
    def __init__(self, device: nc.Device) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Linear(4, 6, device=device), nn.ReLU())
        self.head = nn.Linear(6, 3, device=device)
        self.register_buffer("steps_seen", nc.Tensor.zeros((2,), np.float32, device))
        self.register_buffer("scratch", nc.Tensor.zeros((3,), np.float32, device), persistent=False)

    def forward(self, x: ag.Node) -> ag.Node:
        return self.head(self.features(x))


def _inputs(device: nc.Device, shape=(5, 4), seed=0) -> ag.Node:
    return ag.tensor(np.random.default_rng(seed).normal(size=shape).astype(np.float32), device=device)


def test_registration_names_follow_torch(device):
    model = Block(device)
    assert [n for n, _ in model.named_parameters()] == [
        "features.0.weight",
        "features.0.bias",
        "head.weight",
        "head.bias",
    ]
    assert [n for n, _ in model.named_buffers()] == ["steps_seen", "scratch"]
    # torch's order (a module's own entries, then its children's); the non-persistent buffer is left out
    assert list(model.state_dict()) == [
        "steps_seen",
        "features.0.weight",
        "features.0.bias",
        "head.weight",
        "head.bias",
    ]
    assert [n for n, _ in model.named_modules()] == ["", "features", "features.0", "features.1", "head"]
    assert [type(m).__name__ for m in model.children()] == ["Sequential", "Linear"]
    assert all(isinstance(p, nn.Parameter) and p.requires_grad and p.is_leaf for p in model.parameters())
    assert model.head.weight.shape == (3, 6)


def test_shared_parameter_listed_once_and_reassignment_keeps_order(device):
    lin = nn.Linear(3, 3, device=device)
    model = nn.Sequential(lin, nn.ReLU(), lin)
    assert len(list(model.parameters())) == 2
    first = nn.Linear(2, 2, device=device)
    seq = nn.Sequential(first, nn.ReLU())
    seq.add_module("0", nn.Linear(2, 5, device=device))  # replaces in place: the order stays
    assert [n for n, _ in seq.named_parameters()] == ["0.weight", "0.bias"]
    assert seq[0].out_features == 5


def test_setattr_rules():
    m = nn.Module()
    m.w = nn.Parameter(np.ones(3, np.float32), device="cpu")
    m.w = None  # a declared-but-absent parameter, like bias=False
    assert "w" in m._parameters and m.w is None
    with pytest.raises(TypeError, match="cannot assign ndarray as parameter 'w'"):
        m.w = np.zeros(3)
    m.register_buffer("b", None)
    with pytest.raises(TypeError, match="as buffer 'b'"):
        m.b = [1, 2]
    with pytest.raises(TypeError, match="Parameter: only floating-point"):
        nn.Parameter(np.arange(3), device="cpu")
    with pytest.raises(KeyError, match=r"without '\.'"):
        m.register_buffer("a.b", None)

    class Forgetful(nn.Module):
        def __init__(self) -> None:
            self.w = 1

    with pytest.raises(AttributeError, match=r"before Module\.__init__"):
        Forgetful()


def test_train_eval_and_zero_grad(device):
    model = nn.Sequential(nn.Linear(4, 3, device=device), nn.Dropout(0.5))
    assert model.training and model[1].training
    assert model.eval() is model
    assert not model.training and not model[1].training
    model.train()
    assert model[1].training
    x = _inputs(device)
    with ag.Tape() as tape:
        loss = ag.sum(model[0](x))
    tape.backward(loss)
    assert all(p.grad is not None for p in model.parameters())
    model.zero_grad(set_to_none=False)
    assert all(np.all(p.grad.to_host() == 0) for p in model.parameters())
    model.zero_grad()
    assert all(p.grad is None and p.value.grad is None for p in model.parameters())


def test_to_moves_parameters_in_place():
    if not nc.usable_opencl_devices():
        pytest.skip("no OpenCL device")
    model = Block(nc.get_device("cpu"))
    before = {k: v.to_host() for k, v in model.state_dict().items()}
    weight = model.head.weight
    model.to("opencl")
    assert model.head.weight is weight and weight.device.kind == "opencl"
    assert model.steps_seen.device.kind == "opencl" and model.device.kind == "opencl"
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(value.to_host(), before[key])


def test_state_dict_round_trip_gives_equal_outputs(device):
    ag.manual_seed(1)
    a = Block(device)
    ag.manual_seed(2)
    b = Block(device)
    x = _inputs(device)
    assert not np.allclose(a(x).to_host(), b(x).to_host())
    head_weight = b.head.weight
    result = b.load_state_dict({k: v.to_host() for k, v in a.state_dict().items()})
    assert result == nn.IncompatibleKeys([], [])
    assert b.head.weight is head_weight  # loaded in place
    np.testing.assert_array_equal(a(x).to_host(), b(x).to_host())
    # Tensors and Nodes load too
    c = Block(device)
    c.load_state_dict({k: (ag.tensor(v) if "bias" in k else v) for k, v in a.state_dict().items()})
    np.testing.assert_array_equal(a(x).to_host(), c(x).to_host())


def test_load_state_dict_errors_name_the_keys_and_write_nothing(device):
    model = Block(device)
    good = {k: v.to_host() for k, v in model.state_dict().items()}
    before = model.head.bias.to_host()
    changed = {k: v + 1 for k, v in good.items()}
    missing = dict(changed)
    del missing["head.bias"]
    with pytest.raises(KeyError, match=r"missing keys \['head.bias'\]"):
        model.load_state_dict(missing)
    with pytest.raises(KeyError, match=r"unexpected keys \['extra.weight'\]"):
        model.load_state_dict({**changed, "extra.weight": np.zeros(2)})
    bad_shape = {**changed, "head.weight": np.zeros((6, 3), np.float32)}
    with pytest.raises(
        nc.ShapeError, match=r"'head.weight' has shape \(6, 3\) in the state dict, but the model's is \(3, 6\)"
    ):
        model.load_state_dict(bad_shape)
    with pytest.raises(TypeError, match="expected a mapping"):
        model.load_state_dict([("head.bias", before)])
    np.testing.assert_array_equal(model.head.bias.to_host(), before)  # nothing was written
    result = model.load_state_dict(missing, strict=False)
    assert result.missing_keys == ["head.bias"] and result.unexpected_keys == []
    np.testing.assert_array_equal(model.head.bias.to_host(), before)
    np.testing.assert_array_equal(model.head.weight.to_host(), good["head.weight"] + 1)


def test_repr_reads_like_torch(device):
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1, device=device),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8, 2, bias=False, device=device),
    )
    assert repr(model) == (
        "Sequential(\n"
        "  (0): Conv2d(1, 8, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))\n"
        "  (1): ReLU()\n"
        "  (2): MaxPool2d(kernel_size=2, stride=2, padding=0)\n"
        "  (3): Flatten(start_dim=1, end_dim=-1)\n"
        "  (4): Linear(in_features=8, out_features=2, bias=False)\n"
        ")"
    )
    nested = nn.Sequential(nn.ModuleList([nn.Identity()]))
    assert repr(nested) == "Sequential(\n  (0): ModuleList(\n    (0): Identity()\n  )\n)"


def test_containers(device):
    layers = nn.ModuleList([nn.Linear(2, 2, device=device) for _ in range(3)])
    layers.append(nn.Linear(2, 4, device=device))
    assert len(layers) == 4 and layers[-1].out_features == 4
    assert [n for n, _ in layers.named_parameters()][-2:] == ["3.weight", "3.bias"]
    with pytest.raises(IndexError, match="index 7 is out of range for 4 modules"):
        layers[7]
    seq = nn.Sequential(nn.Linear(2, 3, device=device), nn.ReLU(), nn.Linear(3, 1, device=device))
    assert isinstance(seq[1:], nn.Sequential) and len(seq[1:]) == 2
    x = _inputs(device, (4, 2))
    np.testing.assert_array_equal(seq(x).to_host(), seq[2](seq[1](seq[0](x))).to_host())
    heads = nn.ModuleDict({"cls": nn.Linear(2, 3, device=device), "box": nn.Linear(2, 4, device=device)})
    heads["extra"] = nn.Identity()
    assert list(heads) == ["cls", "box", "extra"] and "box" in heads and len(heads) == 3
    assert [n for n, _ in heads.named_parameters()] == ["cls.weight", "cls.bias", "box.weight", "box.bias"]
    del heads["extra"]
    with pytest.raises(KeyError, match="ModuleDict has no module 'extra'"):
        heads["extra"]


def test_deepcopy_and_pickle_give_an_independent_equal_model(device):
    """``copy.deepcopy(model)`` (an EMA or target network) and a pickle round trip: the same outputs, their own
    buffers (a step on the copy leaves the original as it was), the same Device object."""
    import copy
    import pickle

    model = Block(device)
    x = _inputs(device)
    model.head.weight.grad = nc.Tensor.from_host(device, np.ones((3, 6), np.float32))
    twin, loaded = copy.deepcopy(model), pickle.loads(pickle.dumps(model))
    with ag.no_grad():
        expected = model(x).to_host()
        for other in (twin, loaded):
            np.testing.assert_array_equal(other(x).to_host(), expected)
            for (name, a), b in zip(model.state_dict().items(), other.state_dict().values(), strict=True):
                np.testing.assert_array_equal(a.to_host(), b.to_host(), err_msg=name)
    assert twin.head.weight.value.device is device and loaded.head.weight.value.device is device
    np.testing.assert_array_equal(twin.head.weight.grad.to_host(), np.ones((3, 6), np.float32))
    before = model.head.weight.to_host()
    twin.head.weight.value.device.storage.zero(twin.head.weight.value)  # change the copy in place
    np.testing.assert_array_equal(model.head.weight.to_host(), before)
    assert not twin.head.weight.to_host().any()


def test_to_a_dtype_casts_floating_state_in_place(device):
    """``to(float64)`` / ``double()`` / ``half()`` / ``float()`` as torch's: the Parameter objects stay and hold
    cast tensors, integer buffers keep their dtype, the model computes in the new dtype."""
    model = nn.Sequential(nn.Linear(4, 3, device=device), nn.BatchNorm1d(3, device=device))
    weight = model[0].weight
    host = weight.to_host().astype(np.float64)
    assert model.to(np.float64) is model and model[0].weight is weight
    assert weight.dtype == np.float64 and model[1].running_mean.dtype == np.float64
    assert model[1].num_batches_tracked.dtype == np.int64
    np.testing.assert_array_equal(weight.to_host(), host)
    x = ag.tensor(np.ones((5, 4)), device=device, dtype=np.float64)
    assert model(x).dtype == np.float64
    assert model.float()[0].weight.dtype == np.float32 and model.double()[0].bias.dtype == np.float64
    assert (
        model.to("float16")[0].weight.dtype == np.float16 and model.to(device, "float32")[0].weight.dtype == np.float32
    )
    with pytest.raises(TypeError, match="floating-point type, got int32"):
        model.to(np.int32)
    with pytest.raises(TypeError, match="needs a device, a dtype or both"):
        model.to()


def test_forward_hooks_run_around_forward_and_can_be_removed(device):
    """torch's forward pre-hooks (may replace the arguments) and forward hooks (see args and output, may replace
    the output); ``remove()`` takes one off."""
    layer = nn.Linear(2, 2, device=device)
    layer.load_state_dict({"weight": np.eye(2), "bias": np.zeros(2)})
    seen = []
    doubled = layer.register_forward_pre_hook(lambda module, args: (args[0] * 2.0,))
    logged = layer.register_forward_hook(lambda module, args, out: seen.append((module, out.to_host())))
    plus_one = layer.register_forward_hook(lambda module, args, out: out + 1.0)
    x = ag.tensor(np.array([[1.0, 2.0]], np.float32), device=device)
    np.testing.assert_array_equal(layer(x).to_host(), [[3.0, 5.0]])
    assert seen[0][0] is layer and np.array_equal(seen[0][1], [[2.0, 4.0]])
    doubled.remove(), plus_one.remove(), logged.remove(), logged.remove()
    np.testing.assert_array_equal(layer(x).to_host(), [[1.0, 2.0]])
    assert len(seen) == 1
    with pytest.raises(TypeError, match="hook must be callable"):
        layer.register_forward_hook(3)


def test_get_submodule_and_parameter_by_dotted_path(device):
    model = Block(device)
    assert model.get_submodule("features.0") is model.features[0] and model.get_submodule("") is model
    assert model.get_parameter("head.bias") is model.head.bias
    with pytest.raises(AttributeError, match="has no submodule 'tail'"):
        model.get_submodule("features.tail")
    with pytest.raises(AttributeError, match=r"'head\.scale' is not a parameter"):
        model.get_parameter("head.scale")
