"""Bad input to paged_decode raises ValueError naming the argument, the expected, the actual."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from bad_input_helpers import decode_args_of, small_paged_case
from conftest import assert_close

from attn_core import paged_decode
from attn_core.reference import reference_decode


def good() -> dict[str, Any]:
    return decode_args_of(small_paged_case(), 40)


def with_(**changes: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    args = good()
    for key, change in changes.items():
        args[key] = change(args)
    return args


BAD = [
    ("query rank", with_(query=lambda a: a["query"][0]), r"query must have 3 dimensions"),
    (
        "query dtype",
        with_(query=lambda a: a["query"].double()),
        r"query must be .*float16.*got torch.float64",
    ),
    (
        "query head size",
        with_(query=lambda a: a["query"][..., :32]),
        r"query must have shape \[\*, \*, 64\]",
    ),
    (
        "heads not divisible",
        with_(query=lambda a: a["query"][:, :7]),
        r"num_heads must be divisible by num_kv_heads \(2\), got 7",
    ),
    (
        "key dtype",
        with_(key_cache=lambda a: a["key_cache"].float()),
        r"key_cache must be torch.float16",
    ),
    (
        "key x",
        with_(key_cache=lambda a: a["key_cache"].reshape(*a["key_cache"].shape[:2], 16, 16, 4)),
        r"key_cache's last dimension must be x",
    ),
    (
        "value shape",
        with_(value_cache=lambda a: a["value_cache"][:, :1]),
        r"value_cache must have shape",
    ),
    (
        "head size",
        with_(
            key_cache=lambda a: a["key_cache"][:, :, :6],
            value_cache=lambda a: a["value_cache"][:, :, :48],
            query=lambda a: a["query"][..., :48],
        ),
        r"head_size must be one of",
    ),
    (
        "block size",
        with_(
            key_cache=lambda a: a["key_cache"][:, :, :, :12],
            value_cache=lambda a: a["value_cache"][..., :12],
        ),
        r"block_size must be one of .*got 12",
    ),
    (
        "tables dtype",
        with_(block_tables=lambda a: a["block_tables"].long()),
        r"block_tables must be torch.int32, got torch.int64",
    ),
    (
        "tables rows",
        with_(block_tables=lambda a: a["block_tables"][:1]),
        r"block_tables must have shape \[2, \*\]",
    ),
    (
        "seq_lens dtype",
        with_(seq_lens=lambda a: a["seq_lens"].long()),
        r"seq_lens must be torch.int32, got torch.int64",
    ),
    (
        "seq_lens shape",
        with_(seq_lens=lambda a: a["seq_lens"][:1]),
        r"seq_lens must have shape \[2\]",
    ),
    ("max_seq_len", with_(max_seq_len=lambda a: 0), r"max_seq_len must be a positive int, got 0"),
    (
        "not a tensor",
        with_(seq_lens=lambda a: [5, 40]),
        r"seq_lens must be a torch.Tensor, got list",
    ),
]


@pytest.mark.parametrize(("args", "match"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_arguments(args: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        paged_decode(**args)


def test_bad_keyword_arguments() -> None:
    args = good()
    with pytest.raises(ValueError, match=r"alibi_slopes must have shape \[8\]"):
        paged_decode(**args, alibi_slopes=torch.ones(4))
    with pytest.raises(ValueError, match=r"alibi_slopes must be torch.float32"):
        paged_decode(**args, alibi_slopes=torch.ones(8, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"kv_cache_dtype must be one of"):
        paged_decode(**args, kv_cache_dtype="int8")
    with pytest.raises(ValueError, match=r"key_cache must be torch.uint8 for kv_cache_dtype='fp8'"):
        paged_decode(**args, kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match=r"k_scale must be a positive float, got 0"):
        paged_decode(**args, k_scale=0)
    with pytest.raises(ValueError, match=r"out must have shape"):
        paged_decode(**args, out=torch.empty(2, 8, 32, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"out must be torch.float16, got torch.float32"):
        paged_decode(**args, out=torch.empty(2, 8, 64))
    with pytest.raises(ValueError, match=r"scale must be a float or None, got str"):
        paged_decode(**args, scale="0.1")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda a: a["seq_lens"].fill_(0), r"seq_lens must be in \[1, 80\].*got min 0"),
        (
            lambda a: a["seq_lens"].fill_(81),
            r"seq_lens must be in \[1, 80\] \(block_tables' capacity\), got min 81 max 81",
        ),
        (lambda a: a["seq_lens"].fill_(50), r"seq_lens must be <= max_seq_len \(40\), got max 50"),
        (
            lambda a: a["block_tables"].fill_(10_000),
            r"block_tables entries in use must be in \[0, ",
        ),
        (lambda a: a["block_tables"].fill_(-1), r"block_tables entries in use must be in \[0, "),
    ],
)
def test_value_checks(change, match: str, settings_env) -> None:
    args = good()
    change(args)
    settings_env.set("ATTN_CORE_CHECKS", "1")
    with pytest.raises(ValueError, match=match):
        paged_decode(**args)


def test_value_checks_pass_on_good_input(settings_env) -> None:
    """With the value checks on, good input gives the reference's output, bit for bit the
    output without them (the checks read values, they change nothing)."""
    args = good()
    unchecked = paged_decode(**args, out=torch.full_like(args["query"], math.nan))
    settings_env.set("ATTN_CORE_CHECKS", "1")
    checked = paged_decode(**args, out=torch.full_like(args["query"], math.nan))
    assert torch.equal(checked.view(torch.int16), unchecked.view(torch.int16))
    want = reference_decode(
        args["query"], args["key_cache"], args["value_cache"], args["block_tables"],
        args["seq_lens"],
    )  # fmt: skip
    assert_close(checked, want, torch.float16)
