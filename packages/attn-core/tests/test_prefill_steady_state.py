"""Resolve once, run many, for prefill (issue 15's rule): vLLM calls ``paged_prefix_prefill``
once per layer per chunk, so a steady-state call reads no environment, resolves nothing and
enters only the validate / execute code; the next chunk of a growing context reuses the plan
of its length bucket; a settings reload resolves again."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import assert_close
from prefill_helpers import reference
from test_steady_state import RESOLVING, a_repeat_reads_no_environment, attn_core_files_entered

from attn_core import paged_prefix_prefill
from attn_core.core import settings
from attn_core.core.workspace import Workspace
from attn_core.reference import PrefillCase, make_prefill_case
from attn_core.runtime import prefill as runtime_prefill
from attn_core.runtime import resolve

# Decode's resolver files and prefill's own: pricing, the fused check, and the native binding
# (its library and reference check; native readiness is native/loader.py, in RESOLVING): a
# torch-path call has no business there.
PREFILL_RESOLVING = RESOLVING | {"prefill/cost.py", "prefill/verify.py", "native/prefill.py"}
# attn_core files a steady torch-path prefill call enters: 8 on 2026-12-02 (the entry point,
# checks, cache layout, workspace, settings, torch path, problem, gather), 142 Python calls;
# before plans were cached every call also entered shapes, plan, resolve, detect, plan_native,
# capabilities and cost: 15 files, 246 calls (this file's case, CPU).
MAX_FILES = 10
SEQS = [(2000, 37), (0, 5), (300, 20)]  # (context, chunk): a long one, a fresh one, a short one


@pytest.fixture
def case() -> PrefillCase:
    return make_prefill_case(SEQS, 8, 2, 64, 16, torch.float32, seed=7)


class Resolutions(list):
    """Plans the resolver made, in order, and the features each was asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[dict] = []


@pytest.fixture
def resolutions(monkeypatch) -> Resolutions:
    """Every plan the resolver makes (behind its cache)."""
    made = Resolutions()
    real = resolve.prefill_plan_for

    def counting(*args, **kwargs):
        features = ("alibi", "sliding_window", "large_scale")
        made.asked.append({k: kwargs[k] for k in features})
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(resolve, "prefill_plan_for", counting)
    return made


def call(case: PrefillCase, ws: Workspace, **kwargs) -> torch.Tensor:
    out = torch.full_like(case.query, math.nan)
    args = list(case.args())
    args[-1] = kwargs.pop("max_query_len", case.max_query_len)
    return paged_prefix_prefill(*args, **case.kwargs(), out=out, workspace=ws, **kwargs)


def later_chunk(case: PrefillCase, first_context: int) -> PrefillCase:
    """The same chunk tokens with sequence 0's context at ``first_context`` (the same caches
    and block table: a chunk further along a growing context)."""
    ctx = case.context_lens.clone()
    ctx[0] = first_context
    qlen = case.query_start_loc[1:] - case.query_start_loc[:-1]
    return dataclasses.replace(
        case, context_lens=ctx, seq_lens=(ctx + qlen).to(case.seq_lens.dtype)
    )


def test_a_second_identical_call_reads_no_environment(case, monkeypatch) -> None:
    ws = Workspace()
    counting, second = a_repeat_reads_no_environment(monkeypatch, lambda: call(case, ws))
    later = [later_chunk(case, n) for n in (1990, 1500)]  # the same bucket, and a new one
    counting.reads = 0
    for chunk in later:
        call(chunk, ws)
    assert counting.reads == 0  # a new bucket resolves from the snapshot, not the environment
    assert_close(second, reference(case), torch.float32)


@pytest.mark.parametrize("first_context", (2000, 1990))
def test_a_steady_call_enters_no_resolver_code(case, first_context: int) -> None:
    ws = Workspace()
    chunk = later_chunk(case, first_context)
    call(chunk, ws)
    args, kwargs, out = chunk.args(), chunk.kwargs(), torch.empty_like(chunk.query)
    files, calls, _ = attn_core_files_entered(
        lambda: paged_prefix_prefill(*args, **kwargs, out=out, workspace=ws)
    )
    assert not set(files) & PREFILL_RESOLVING, files
    assert len(files) <= MAX_FILES, files
    assert files[0] == "runtime/prefill.py"
    assert calls < 200, calls


def test_chunks_in_one_bucket_share_a_plan(case, resolutions) -> None:
    """Contexts 1980 and 2000 (bucket 2048 = the table's capacity) and chunks of 37 and 38
    tokens (bucket 38) resolve once; a context of 1500 (bucket 1536) resolves again."""
    ws = Workspace()
    for first_context in (2000, 1980):
        chunk = later_chunk(case, first_context)
        for max_query_len in (37, 38):
            out = call(chunk, ws, max_query_len=max_query_len)
            assert_close(out, reference(chunk), torch.float32)
    assert len(resolutions) == 1
    keys = [k for k in runtime_prefill._PLANS if k[-1] == settings.generation()]
    # one plan cache: the four call keys and their bucket's key, one plan
    assert len(keys) == 5 and len({id(runtime_prefill._PLANS[k]) for k in keys}) == 1
    assert call(later_chunk(case, 1980), ws) is not None  # a key already seen: no resolution
    assert len(resolutions) == 1
    chunk = later_chunk(case, 1500)
    assert_close(call(chunk, ws), reference(chunk), torch.float32)
    assert len(resolutions) == 2


def test_a_reload_resolves_again(case, settings_env, resolutions) -> None:
    ws = Workspace()
    call(case, ws)
    assert len(resolutions) == 1 and resolutions[0].budget_bytes == 1 << 30
    settings_env.set("ATTN_CORE_PREFILL_BUDGET_BYTES", str(1 << 20))
    out = call(case, ws)
    assert len(resolutions) == 2 and resolutions[1].budget_bytes == 1 << 20
    assert resolutions[1].query_tile < resolutions[0].query_tile  # the new budget took effect
    assert_close(out, reference(case), torch.float32)


def test_features_and_large_scales_are_planned_apart(case, resolutions) -> None:
    """ALiBi, a window and a scale > 1 are planner inputs: each resolves its own plan (the
    scale's fp32 scores are the planner's, tests/test_plan_prefill.py), a scale <= 1 shares
    the default one."""
    ws = Workspace()
    call(case, ws)
    call(case, ws, scale=0.5)
    call(case, ws, scale=64.0)
    call(dataclasses.replace(case, sliding_window=100), ws)
    slopes = torch.linspace(0.1, 0.8, case.query.shape[1])
    call(dataclasses.replace(case, alibi_slopes=slopes), ws)
    assert resolutions.asked == [
        {"alibi": False, "sliding_window": 0, "large_scale": False},
        {"alibi": False, "sliding_window": 0, "large_scale": True},
        {"alibi": False, "sliding_window": 100, "large_scale": False},
        {"alibi": True, "sliding_window": 0, "large_scale": False},
    ]


def test_bucketed_lengths_cover_the_call() -> None:
    """Every bucket is at least the call's length and at most 1/16 (or, for the context, 256
    tokens) more; the query bucket never passes the next power of two (the torch tile)."""
    for n in (*range(1, 300), 1000, 4095, 4097, 8192, 100_000, 131_071):
        lengths = resolve.prefill_lengths_bucket(n, n, n, n, 1 << 30)
        next_pow2 = 1 << (n - 1).bit_length()
        assert n <= lengths.max_query_len <= min(next_pow2, n + n // 16 + (n < 32))
        assert n <= lengths.num_seqs <= n + n // 16 and lengths.num_tokens >= n
        assert n <= lengths.max_context_len <= n + max(256, n // 16)
    capped = resolve.prefill_lengths_bucket(37, 1990, 3, 62, 2000)
    assert capped.max_context_len == 2000  # the table's capacity
    assert capped.num_tokens <= capped.num_seqs * capped.max_query_len
    assert resolve.prefill_lengths_bucket(5, 0, 1, 5, 0).max_context_len == 0
