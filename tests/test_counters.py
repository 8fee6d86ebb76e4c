"""StepCounter's shortcuts past the fake device: in-place foreach ops, device and .item()."""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from trainplan.trace.counters import StepCounter, _inplace_foreach
from trainplan.trace.tracer import _subtree_sums

aten = torch.ops.aten


def test_only_list_ops_that_return_nothing_are_in_place_foreach():
    assert _inplace_foreach(aten._foreach_add_.List)
    assert _inplace_foreach(aten._foreach_addcdiv_.ScalarList)
    assert not _inplace_foreach(aten._foreach_sqrt.default)    # allocates its outputs
    assert not _inplace_foreach(aten.add_.Tensor)              # returns self
    assert not _inplace_foreach(aten.mm.default)


def test_adamw_steps_on_fake_tensors_advance_and_are_counted():
    """Two AdamW (foreach) steps: step counts (fake tensors mirroring real constants) advance,
    states are allocated once, and each in-place update is recorded with its bytes."""
    counter = StepCounter()
    with FakeTensorMode(allow_non_fake_inputs=True), counter:
        params = [torch.nn.Parameter(torch.empty(256, 64)), torch.nn.Parameter(torch.empty(64))]
        opt = torch.optim.AdamW(params, lr=1e-3, foreach=True)
        for _ in range(2):
            for p in params:
                p.grad = torch.zeros_like(p)
            opt.step()
        steps = [opt.state[p]["step"].item() for p in params]
    assert steps == [2.0, 2.0]
    state_bytes = sum(t.numel() * 4 for p in params
                      for k, t in opt.state[p].items() if k != "step")
    assert state_bytes == 2 * (256 * 64 + 64) * 4
    lerps = [r for r in counter.records if r.name == "_foreach_lerp_"]
    assert len(lerps) == 2
    # reads exp_avg and grad, writes exp_avg: 3 x the fp32 parameter bytes
    assert lerps[0].bytes == 3 * (256 * 64 + 64) * 4


def test_subtree_sums_add_each_module_to_its_ancestors():
    sums = _subtree_sums({"": 1, "enc": 2, "enc.layer.0": 3, "enc.layer.10": 5, "head": 7}.items())
    assert sums == {"": 18, "enc": 10, "enc.layer": 8, "enc.layer.0": 3, "enc.layer.10": 5,
                    "head": 7}
