"""models/hooks.py: captured tensors equal a hand-run forward, and hooks are always removed."""

import pytest
import torch
from torch import nn

from lit_svd.models.hooks import Hook, capture, hooks


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))


def test_capture_matches_manual_forward():
    net, x = _net(), torch.randn(7, 4)
    with capture({"in2": net[2]}, "pre") as ins, capture({"out0": net[0]}, "post") as outs:
        net(x)
    h = net[0](x)
    torch.testing.assert_close(outs["out0"], h, rtol=0, atol=0)
    torch.testing.assert_close(ins["in2"], torch.tanh(h), rtol=0, atol=0)
    assert not net[0]._forward_hooks and not net[2]._forward_pre_hooks


def test_hooks_change_output_and_are_removed_on_error():
    net, x = _net(), torch.randn(7, 4)
    plain = net(x)
    with hooks(Hook(net[2], lambda m, a, k, out: 2 * out, "post")):
        torch.testing.assert_close(net(x), 2 * plain)
    with pytest.raises(RuntimeError):
        with hooks(Hook(net[0], lambda m, a, k: ((a[0] * 0,), k), "pre")):
            raise RuntimeError("boom")
    assert not net[0]._forward_pre_hooks and not net[2]._forward_hooks
    torch.testing.assert_close(net(x), plain, rtol=0, atol=0)


def test_bad_kind_is_rejected_and_nothing_left_behind():
    net = _net()
    with pytest.raises(ValueError, match="kind"):
        with hooks(Hook(net[0], lambda *a: None, "post"), Hook(net[2], lambda *a: None, "middle")):
            pass
    assert not net[0]._forward_hooks and not net[2]._forward_hooks
