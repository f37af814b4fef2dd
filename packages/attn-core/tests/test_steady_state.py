"""Resolve once, run many: a steady-state decode call reads no environment, resolves nothing
and enters only the validate / execute code (issue 15)."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path

import pytest
import torch
from conftest import assert_close

from attn_core import paged_decode
from attn_core.core import settings
from attn_core.core.cache_layout import validate_caches
from attn_core.core.workspace import Workspace
from attn_core.decode.bounds import max_seq_len_bucket
from attn_core.reference import make_paged_case, reference_decode
from attn_core.runtime.decode import plan_for

# The resolver's side: none of these may run in a steady-state call (files as
# attn_core_files_entered names them: package/file, since runtime/, decode/, prefill/ and native/
# share file names).
RESOLVING = {
    "runtime/resolve.py", "device/detect.py", "device/capabilities.py", "decode/plan.py",
    "prefill/plan.py", "decode/plan_native.py", "prefill/plan_native.py", "core/verify_once.py",
    "native/loader.py", "native/split.py",
}  # fmt: skip
MAX_FILES = 10  # attn_core files a steady-state torch-path call may enter (17 before issue 15)


class CountingEnviron(MutableMapping):
    """``os.environ`` that counts every read."""

    def __init__(self, real: MutableMapping) -> None:
        self.real, self.reads = real, 0

    def __getitem__(self, key):
        self.reads += 1
        return self.real[key]

    def __setitem__(self, key, value) -> None:
        self.real[key] = value

    def __delitem__(self, key) -> None:
        del self.real[key]

    def __iter__(self) -> Iterator:
        self.reads += 1
        return iter(self.real)

    def __len__(self) -> int:
        return len(self.real)

    def get(self, key, default=None):
        self.reads += 1
        return self.real.get(key, default)


def call(case, max_seq_len: int, ws: Workspace, **kwargs) -> torch.Tensor:
    out = torch.full_like(case.query, math.nan)
    return paged_decode(
        case.query, case.key_cache, case.value_cache, case.block_tables, case.seq_lens,
        max_seq_len, out=out, workspace=ws, **kwargs,
    )  # fmt: skip


@pytest.fixture
def case():
    return make_paged_case((5, 40, 1000), 8, 2, 64, 16, torch.float32, seed=11)


def a_repeat_reads_no_environment(
    monkeypatch: pytest.MonkeyPatch, call_once: Callable[[], torch.Tensor]
) -> tuple[CountingEnviron, torch.Tensor]:
    """``os.environ`` counted, the settings snapshot taken (which reads it), then ``call_once``
    twice: the second call reads no environment and gives the first's bits. Returns the
    counter (at zero) and the second result."""
    counting = CountingEnviron(os.environ)
    monkeypatch.setattr(os, "environ", counting)
    settings.reload()  # the one read: the snapshot is taken here
    assert counting.reads > 0
    first = call_once()
    counting.reads = 0
    second = call_once()
    assert counting.reads == 0
    assert torch.equal(first, second)
    return counting, second


def test_a_second_identical_call_reads_no_environment(case, monkeypatch) -> None:
    ws = Workspace()
    counting, _ = a_repeat_reads_no_environment(monkeypatch, lambda: call(case, 1000, ws))
    # a longer max_seq_len in the same bucket, and a new one: still no environment read
    capacity = case.block_tables.shape[1] * 16
    assert max_seq_len_bucket(1030, capacity) != max_seq_len_bucket(1000, capacity)
    call(case, 1001, ws)
    call(case, 1030, ws)
    assert counting.reads == 0


def test_a_reload_takes_effect_on_the_next_call(case, settings_env) -> None:
    ws = Workspace()
    call(case, 1000, ws)
    before = settings.generation()
    settings_env.set("ATTN_CORE_DECODE_TIER", "partitioned")
    assert settings.generation() == before + 1
    layout = validate_caches(
        case.key_cache,
        case.value_cache,
        "auto",
        compute_dtype=torch.float32,
        device=case.query.device,
    )
    assert plan_for(case.query, layout, case.block_tables.shape[1], 1000).tier == "partitioned"
    want = reference_decode(
        case.query, case.key_cache, case.value_cache, case.block_tables, case.seq_lens
    )
    assert_close(call(case, 1000, ws), want, torch.float32)


def test_backend_argument_wins_over_the_environment(case, settings_env) -> None:
    settings_env.set("ATTN_CORE_DECODE_BACKEND", "native")
    with pytest.raises(ValueError, match="'native'.*needs a CUDA device, got cpu"):
        call(case, 1000, Workspace())
    out = call(case, 1000, Workspace(), backend="torch")
    want = reference_decode(
        case.query, case.key_cache, case.value_cache, case.block_tables, case.seq_lens
    )
    assert_close(out, want, torch.float32)


def attn_core_files_entered(fn) -> tuple[list[str], int, int]:
    """``(files in the order first entered, Python calls, returns to a file already left)``;
    a file is named with its package (``runtime/decode.py``, ``native/decode.py``)."""
    order: list[str] = []
    calls = [0]

    def profile(frame, event, arg) -> None:
        if event != "call":
            return
        calls[0] += 1
        path = frame.f_code.co_filename
        if "attn_core" in path:
            order.append(f"{Path(path).parent.name}/{Path(path).name}")

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    firsts: list[str] = []
    returns = 0
    previous = None
    for name in order:
        if name != previous and name in firsts:
            returns += 1
        if name not in firsts:
            firsts.append(name)
        previous = name
    return firsts, calls[0], returns


@pytest.mark.parametrize("max_seq_len", (1000, 1008))
def test_a_steady_call_enters_no_resolver_code(case, max_seq_len: int) -> None:
    ws = Workspace()
    call(case, max_seq_len, ws)
    files, calls, _ = attn_core_files_entered(lambda: call(case, max_seq_len, ws))
    assert not set(files) & RESOLVING, files
    assert len(files) <= MAX_FILES, files
    assert files[0] == "runtime/decode.py"
    assert calls < 200  # 236 Python calls before issue 15, about 70 after


def test_an_unknown_backend_is_named(case) -> None:
    with pytest.raises(
        ValueError, match="backend must be None or one of torch, native, got 'cuda'"
    ):
        call(case, 1000, Workspace(), backend="cuda")
