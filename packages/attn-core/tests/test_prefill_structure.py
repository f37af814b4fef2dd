"""How the torch backend executes: buffers allocated once per call (never per key tile), K/V
never expanded per query head, and no host reads beyond the one of the packed lengths."""

from __future__ import annotations

from collections import Counter

import torch
from plan_helpers import prefill_plan
from torch.utils._python_dispatch import TorchDispatchMode

from attn_core import paged_prefix_prefill
from attn_core.reference import make_prefill_case


class _Ops(TorchDispatchMode):
    """Records every aten op; ``allocating`` counts ops that return fresh tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.names: Counter = Counter()
        self.allocating = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.names[func.overloadpacket.__name__] += 1
        if not (func._schema.is_mutable or func.is_view):
            self.allocating += 1
        return func(*args, **kwargs)


def _trace(ctx: int, key_tile: int = 32) -> _Ops:
    case = make_prefill_case(((ctx, 24),), 8, 2, 64, 16, torch.float16, seed=ctx)
    plan = prefill_plan(
        8, 2, 64, torch.float16, 24, backend="torch", query_tile=32, key_tile=key_tile
    )
    out = torch.empty_like(case.query)
    ops = _Ops()
    with ops:
        paged_prefix_prefill(*case.args(), out=out, plan=plan)
    return ops


def test_allocations_do_not_grow_with_key_tiles() -> None:
    """1 context tile vs 9: the same number of allocating ops (gathers are per sequence)."""
    one, many = _trace(32), _trace(32 * 9)
    assert many.names["bmm"] - one.names["bmm"] == 2 * 8  # QK and PV per extra key tile
    assert many.allocating == one.allocating


def test_row_sums_come_from_the_pv_gemm() -> None:
    """No reduction pass per key tile beyond the row max: the P@V GEMM yields the row sums
    (a ones column beside V), so 8 more key tiles add amax calls but no sum calls."""
    one, many = _trace(32), _trace(32 * 9)
    assert many.names["amax"] - one.names["amax"] == 8
    assert many.names["sum"] == one.names["sum"]


def test_no_per_head_kv_expansion() -> None:
    ops = _trace(100)
    for name in ("repeat_interleave", "repeat", "expand_copy"):
        assert ops.names[name] == 0, name


def test_one_host_read_per_call(monkeypatch) -> None:
    """Only the packed lengths come to the host: one ``tolist`` and no other value read."""
    reads: Counter = Counter()
    for name in ("tolist", "item", "__bool__", "__int__", "__float__", "cpu", "numpy"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            reads[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    case = make_prefill_case(((100, 24), (0, 9), (37, 1)), 8, 2, 64, 16, torch.float16)
    reads.clear()  # building the case may read values; the call is what is measured
    paged_prefix_prefill(*case.args(), out=torch.empty_like(case.query))
    assert reads == Counter({"tolist": 1}), reads


def test_workspace_reused_across_calls() -> None:
    """With a Workspace, a second call of the same size allocates no tile buffer and agrees."""
    from prefill_helpers import reference

    from attn_core.core.workspace import Workspace

    case = make_prefill_case(((70, 24), (0, 9)), 8, 2, 64, 16, torch.float32, seed=2)
    ws = Workspace()
    first = paged_prefix_prefill(*case.args(), workspace=ws)
    held = ws.allocations
    assert held > 0
    second = paged_prefix_prefill(*case.args(), workspace=ws)
    assert ws.allocations == held
    torch.testing.assert_close(first, second, atol=0, rtol=0)
    torch.testing.assert_close(second.double(), reference(case), atol=2e-5, rtol=2e-5)


def test_workspace_argument_checked() -> None:
    import pytest

    case = make_prefill_case(((5, 3),), 4, 2, 64, 16, torch.float32)
    with pytest.raises(ValueError, match="workspace must be an attn_core Workspace"):
        paged_prefix_prefill(*case.args(), workspace=object())


def test_plan_counts_the_tile_updates_that_run() -> None:
    """plan.num_tile_updates (what the simulator multiplies the steps by) matches execution."""
    for ctx, qlen, tq, tk in ((100, 24, 8, 16), (0, 37, 16, 8), (33, 1, 4, 32), (64, 64, 64, 64)):
        case = make_prefill_case(((ctx, qlen),), 8, 2, 64, 16, torch.float16, seed=ctx)
        plan = prefill_plan(
            8, 2, 64, torch.float16, qlen, backend="torch", query_tile=tq, key_tile=tk
        )
        ops = _Ops()
        with ops:
            paged_prefix_prefill(*case.args(), plan=plan)
        assert ops.names["bmm"] == 2 * plan.num_tile_updates(qlen, ctx), (ctx, qlen, tq, tk)
