"""One Workspace, several threads: a RuntimeError naming the workspace and both threads, never
silent wrong results (issue 11 saw max abs error 50.8 and IndexErrors from shared scratch)."""

from __future__ import annotations

import threading

import pytest
import torch
from bad_input_helpers import decode_args, prefill_args
from decode_helpers import reference

from attn_core import paged_decode, paged_prefix_prefill
from attn_core.core.workspace import Workspace, check_workspace
from attn_core.reference import make_paged_case


def in_thread(fn, name: str = "other") -> BaseException | None:
    """Run ``fn`` on a new thread; what it raised (None if nothing)."""
    raised: list[BaseException] = []

    def body() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            raised.append(exc)

    t = threading.Thread(target=body, name=name)
    t.start()
    t.join()
    return raised[0] if raised else None


@pytest.mark.parametrize(
    ("fn", "make_args"),
    ((paged_decode, decode_args), (paged_prefix_prefill, prefill_args)),
    ids=("decode", "prefill"),
)
def test_second_thread_using_a_workspace_raises(fn, make_args) -> None:
    ws = Workspace()
    args = make_args()
    fn(**args, workspace=ws)  # this thread owns it now
    exc = in_thread(lambda: fn(**args, workspace=ws), name="intruder")
    assert isinstance(exc, RuntimeError), exc
    message = str(exc)
    assert f"Workspace at {id(ws):#x}" in message
    assert threading.current_thread().name in message and "'intruder'" in message
    fn(**args, workspace=ws)  # the owner keeps working


def test_release_hands_the_workspace_over() -> None:
    ws = Workspace()
    args = decode_args()
    paged_decode(**args, workspace=ws)
    ws.release()
    assert ws.owner is None
    assert in_thread(lambda: paged_decode(**args, workspace=ws), name="heir") is None
    assert ws.owner is not None and ws.owner[1] == "heir"
    with pytest.raises(RuntimeError, match="belongs to thread 'heir'"):
        paged_decode(**args, workspace=ws)


def test_racing_first_claims_have_one_winner() -> None:
    ws = Workspace()
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def claim() -> None:
        start.wait()
        try:
            check_workspace(ws)
        except RuntimeError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claim) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 3


def test_threads_with_default_workspaces_run_concurrently_and_exactly() -> None:
    """workspace=None uses a per-thread default: concurrent calls stay exact."""
    cases = [
        make_paged_case((37 * (i + 1), 9), 8, 2, 64, 16, torch.float32, seed=i) for i in range(4)
    ]
    results: dict[int, torch.Tensor] = {}
    start = threading.Barrier(len(cases))

    def work(i: int) -> None:
        c = cases[i]
        start.wait()
        for _ in range(5):
            results[i] = paged_decode(
                c.query, c.key_cache, c.value_cache, c.block_tables, c.seq_lens, c.max_seq_len
            )

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, c in enumerate(cases):
        torch.testing.assert_close(results[i].double(), reference(c), atol=2e-5, rtol=2e-5)
