"""How far the caller's ``query`` travels through attn-core in a steady-state call: every
frame of an attn-core function that holds it (the tensor, or a view of its storage) in its
locals, in call order, as a walk over files. A call that passes the query through many files,
or in and out of the same ones, is hard to follow and slow on the host; the bound is 12 files
and 12 returns to a file already left (the native decode path on an H100 walks 3 files with 2
returns: docs/benchmarks.md#native-layer-redesign)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import pytest
import torch

import attn_core
from attn_core.reference import make_paged_case, make_prefill_case

SRC = os.path.dirname(attn_core.__file__)
MAX_FILES = MAX_RETURNS = 12


def walk(call: Callable[[], object], query: torch.Tensor) -> list[str]:
    """The files, in order, of the attn-core frames holding ``query`` during ``call()``
    (consecutive repeats merged), entering a call and coming back to its caller alike."""
    ptr = query.data_ptr()

    def holds(frame) -> bool:
        return any(
            v is query or (isinstance(v, torch.Tensor) and v.numel() and v.data_ptr() == ptr)
            for v in frame.f_locals.values()
        )

    files: list[str] = []

    def visit(frame, event, _arg) -> None:
        if event not in ("call", "return") or not frame.f_code.co_filename.startswith(SRC):
            return
        if not holds(frame):
            return
        at = frame if event == "call" else frame.f_back
        if at is None or not at.f_code.co_filename.startswith(SRC):
            return
        name = os.path.relpath(at.f_code.co_filename, SRC)
        if not files or files[-1] != name:
            files.append(name)

    sys.setprofile(visit)
    try:
        call()
    finally:
        sys.setprofile(None)
    return files


def returns(files: list[str]) -> int:
    """Entries of the walk into a file it had already left."""
    left: set[str] = set()
    count = 0
    for i, name in enumerate(files):
        count += name in left
        if i:
            left.add(files[i - 1])
    return count


def _decode() -> tuple[Callable[[], object], torch.Tensor]:
    case = make_paged_case([1000, 300], 8, 2, 128, 16, torch.float16)
    return (
        lambda: attn_core.paged_decode(case.query, case.key_cache, case.value_cache,
                                       case.block_tables, case.seq_lens, max_seq_len=1000),
        case.query,
    )  # fmt: skip


def _prefill() -> tuple[Callable[[], object], torch.Tensor]:
    case = make_prefill_case([(500, 70), (200, 33)], 8, 2, 128, 16, torch.float16)
    args = case.args()
    return lambda: attn_core.paged_prefix_prefill(*args, **case.kwargs()), args[0]


@pytest.mark.parametrize("entry", [_decode, _prefill], ids=["paged_decode", "paged_prefix_prefill"])
def test_the_query_walks_few_files(entry) -> None:
    call, query = entry()
    call()
    call()  # the steady state: plans cached
    files = walk(call, query)
    assert files and files[0].startswith("runtime/"), files
    assert len(set(files)) <= MAX_FILES, files
    assert returns(files) <= MAX_RETURNS, files
