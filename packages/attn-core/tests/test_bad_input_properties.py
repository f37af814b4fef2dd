"""Property: a spoiled tensor or int argument of any entry point is a ValueError that names an
argument and says what it got; never a traceback from inside torch (issue 11, attn-core).

Each example spoils one argument of a good call: not a tensor, one dimension more or less, a
dtype the argument never takes, one size off by one, another device (``meta``). A size that is
only wrong relative to another argument is reported under the argument checked second (e.g.
``value_cache`` against ``key_cache``), so the message must name *an* argument of the call and,
for the unambiguous spoils (type, rank, dtype, device), the spoiled one.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from bad_input_helpers import ENTRY_POINTS
from hypothesis import given, settings
from hypothesis import strategies as st

# the dtypes each tensor argument may never have
NEVER = {
    "query": torch.float64,
    "key": torch.float64,
    "value": torch.float64,
    "key_cache": torch.float64,
    "value_cache": torch.float64,
    "out": torch.float64,
    "block_tables": torch.int16,
    "seq_lens": torch.float32,
    "context_lens": torch.float32,
    "query_start_loc": torch.float32,
    "slot_mapping": torch.float32,
}
INTS = {"max_seq_len", "max_query_len"}


# sizes that may legitimately change alone (a narrower table still holds every sequence)
FREE_AXES = {"block_tables": (1,)}


def spoil(value: Any, how: str, draw, name: str) -> Any:
    if how == "not a tensor":  # None is valid for the optional out
        return draw(st.sampled_from(([1, 2], 3.5, "x") + (() if name == "out" else (None,))))
    if how == "rank +1":
        return value.unsqueeze(0)
    if how == "rank -1":
        return value[0]
    if how == "dtype":
        return None  # filled in by the caller, which knows the argument
    if how == "size":
        axes = [a for a in range(value.dim()) if a not in FREE_AXES.get(name, ())]
        axis = draw(st.sampled_from(axes))
        n = value.shape[axis]
        return value.narrow(axis, 0, n - 1) if n > 1 else torch.cat([value, value], axis)
    if how == "device":
        return value.to("meta")
    raise AssertionError(how)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_property_spoiled_arguments_give_named_value_errors(data) -> None:
    entry = data.draw(st.sampled_from(sorted(ENTRY_POINTS)), label="entry point")
    fn, make_args = ENTRY_POINTS[entry]
    args = make_args()
    names = sorted(n for n in args if isinstance(args[n], torch.Tensor) or n in INTS)
    name = data.draw(st.sampled_from(names), label="argument")
    if name in INTS:
        bad = data.draw(st.sampled_from((0, -1, 2.0, "8", None, True)), label="bad int")
        how = "int"
    else:
        how = data.draw(
            st.sampled_from(("not a tensor", "rank +1", "rank -1", "dtype", "size", "device")),
            label="spoil",
        )
        if how == "device" and name == "query":
            how = "dtype"  # query's device is the call's device: others are then reported
        bad = spoil(args[name], how, data.draw, name)
        if how == "dtype":
            bad = args[name].to(NEVER[name])
    args[name] = bad
    with pytest.raises(ValueError) as info:
        fn(**args)
    message = str(info.value)
    assert "got" in message, message
    named = [n for n in args if message.startswith((f"{n} ", f"{n}'s ", f"{n}["))]
    assert named, f"{entry}({name}: {how}) -> {message!r} names no argument first"
    if how in ("not a tensor", "rank +1", "rank -1", "dtype", "int"):
        assert message.startswith(name), f"{entry}({name}: {how}) -> {message!r}"
