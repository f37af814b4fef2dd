"""The steady-state decode call (runtime/decode_steady.py): a call shaped like one already
validated skips the checks its signature decides, and nothing else.

The native half runs on the CPU with a recording stand-in for the library: the argument block a
steady call launches must equal, byte for byte, the one the full path launched.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import threading

import pytest
import torch
from conftest import assert_close

from attn_core import paged_decode
from attn_core.core.shapes import AttentionShape
from attn_core.core.workspace import Workspace
from attn_core.decode.plan import DecodeLengths, plan_decode
from attn_core.device.capabilities import Capabilities
from attn_core.device.spec import get_device_spec
from attn_core.native import abi
from attn_core.native.decode import DecodeArgs
from attn_core.reference import make_paged_case, reference_decode
from attn_core.runtime import decode as runtime_decode
from attn_core.runtime import decode_steady


@pytest.fixture(autouse=True)
def fresh_steady_state():
    decode_steady.forget()
    yield
    decode_steady.forget()


@pytest.fixture
def case():
    return make_paged_case((5, 40, 1000), 8, 2, 64, 16, torch.float32, seed=3)


def call(case, max_seq_len: int = 1000, **kwargs) -> torch.Tensor:
    kwargs.setdefault("out", torch.full_like(case.query, math.nan))
    return paged_decode(
        case.query, case.key_cache, case.value_cache, case.block_tables, case.seq_lens,
        max_seq_len, **kwargs,
    )  # fmt: skip


def want(case) -> torch.Tensor:
    return reference_decode(
        case.query, case.key_cache, case.value_cache, case.block_tables, case.seq_lens
    )


def test_a_known_signature_skips_validation_and_stays_exact(case, monkeypatch) -> None:
    ws = Workspace()
    first = call(case, workspace=ws)

    def refuse(*args, **kwargs):
        raise AssertionError("a steady call validated its tensors again")

    monkeypatch.setattr(runtime_decode, "_validate", refuse)
    second = call(case, workspace=ws)
    third = call(case, 1001, workspace=ws)  # max_seq_len moves inside its bucket
    assert torch.equal(first, second) and torch.equal(first, third)
    assert_close(second, want(case), torch.float32)


def test_what_varies_per_call_is_still_checked(case) -> None:
    call(case)
    capacity = case.block_tables.shape[1] * 16
    with pytest.raises(ValueError, match=r"max_seq_len must be <= the capacity of block_tables"):
        call(case, capacity + 1)
    for bad in (0, 5.0, True, "1000"):
        with pytest.raises(ValueError, match="max_seq_len must be a positive int"):
            call(case, bad)
    owned = Workspace()
    worker = threading.Thread(target=owned.claim)
    worker.start()
    worker.join()
    with pytest.raises(RuntimeError, match="belongs to thread"):
        call(case, workspace=owned)


def test_a_changed_property_takes_the_full_path(case) -> None:
    call(case)
    with pytest.raises(ValueError, match="block_tables must be"):
        paged_decode(
            case.query, case.key_cache, case.value_cache, case.block_tables.long(),
            case.seq_lens, 1000,
        )  # fmt: skip
    with pytest.raises(ValueError, match="k_scale must be a positive float"):
        call(case, k_scale=math.nan)
    strided = torch.empty(case.query.shape[0], case.query.shape[1], 2 * case.query.shape[2])
    query = strided[:, :, : case.query.shape[2]]
    query.copy_(case.query)  # same sizes, other strides: a new signature
    out = paged_decode(query, case.key_cache, case.value_cache, case.block_tables,
                       case.seq_lens, 1000)  # fmt: skip
    assert_close(out, want(case), torch.float32)


def test_a_settings_reload_decides_again(case, settings_env) -> None:
    call(case)
    case.seq_lens[0] = 10**6  # a bad value: only ATTN_CORE_CHECKS=1 reads values
    settings_env.set("ATTN_CORE_CHECKS", "1")
    with pytest.raises(ValueError, match="seq_lens must be in"):
        call(case)


class RecordingLibrary:
    """Stands in for a loaded native library: keeps each launch's argument block."""

    slots = 8
    platform = "cpu-stand-in"

    def __init__(self) -> None:
        self.launches: list[bytes] = []

    def decode(self, args, stream: int) -> None:
        self.launches.append(ctypes.string_at(ctypes.addressof(args), ctypes.sizeof(args)))


def native_plan(case, lib):
    num_seqs, heads, head_size = case.query.shape
    shape = AttentionShape(heads, case.key_cache.shape[1], head_size, 16, torch.float32)
    lengths = DecodeLengths(num_seqs, 1024, case.block_tables.shape[1])
    caps = Capabilities(device_type="cuda", native_decode=True)
    plan = plan_decode(shape, lengths, get_device_spec("h200"), caps)
    assert plan.backend == "native" and plan.native is not None and plan.native.merged
    return dataclasses.replace(plan, library=lib)


def recording_native_path(case, monkeypatch: pytest.MonkeyPatch) -> RecordingLibrary:
    """Every plan made from here on is :func:`native_plan`'s on a new :class:`RecordingLibrary`
    (returned), launched on stream 0."""
    lib = RecordingLibrary()
    plan = native_plan(case, lib)
    monkeypatch.setattr(runtime_decode, "plan_for", lambda *args, **kwargs: plan)
    monkeypatch.setattr(abi, "current_stream", lambda device: 0)
    return lib


def test_a_steady_native_launch_equals_the_full_paths(case, monkeypatch) -> None:
    lib = recording_native_path(case, monkeypatch)
    ws = Workspace()
    out = torch.empty_like(case.query)
    for _ in range(3):  # full path, then two steady calls
        call(case, out=out, workspace=ws)
    assert len(lib.launches) == 3 and lib.launches[0] == lib.launches[1] == lib.launches[2]
    # new data, same signature: only the query's address differs
    query = case.query.clone()
    paged_decode(query, case.key_cache, case.value_cache, case.block_tables, case.seq_lens,
                 1000, out=out, workspace=ws)  # fmt: skip
    offset = DecodeArgs.query.offset
    before, after = lib.launches[0], lib.launches[3]
    assert before[:offset] == after[:offset] and before[offset + 8 :] == after[offset + 8 :]
    assert int.from_bytes(after[offset : offset + 8], "little") == query.data_ptr()


def test_a_steady_call_follows_the_workspaces_buffers(case, monkeypatch) -> None:
    """The partials' addresses are remembered per step; a grown, cleared or other workspace
    must still get its own buffers' addresses."""
    lib = recording_native_path(case, monkeypatch)
    args = DecodeArgs

    def launched(field) -> int:
        return int.from_bytes(lib.launches[-1][field.offset : field.offset + 8], "little")

    def buffers(ws: Workspace) -> tuple[int, int]:
        device = case.query.device
        return (ws.flat("native_part_out", 1, torch.float32, device).data_ptr(),
                ws.flat("native_part_lse", 1, torch.float32, device).data_ptr())  # fmt: skip

    ws, out = Workspace(), torch.empty_like(case.query)
    call(case, out=out, workspace=ws)  # the full path
    call(case, out=out, workspace=ws)  # steady: remembers the addresses
    call(case, out=out, workspace=ws)  # steady: reuses them
    assert (launched(args.part_out), launched(args.part_lse)) == buffers(ws) != (0, 0)
    twin = Workspace()  # the same generation as ws once it made its two buffers
    call(case, out=out, workspace=twin)
    assert twin.generation == ws.generation
    assert (launched(args.part_out), launched(args.part_lse)) == buffers(twin)
    call(case, out=out, workspace=ws)
    assert (launched(args.part_out), launched(args.part_lse)) == buffers(ws)
    # another caller grows a buffer: the old address is no longer the buffer's
    grown = ws.flat("native_part_out", 1 << 20, torch.float32, case.query.device)
    call(case, out=out, workspace=ws)
    assert launched(args.part_out) == grown.data_ptr()
    other = Workspace()
    call(case, out=out, workspace=other)
    assert (launched(args.part_out), launched(args.part_lse)) == buffers(other)
    assert launched(args.part_out) != grown.data_ptr()
    ws.clear()  # every buffer dropped: new ones, new addresses
    call(case, out=out, workspace=ws)
    assert (launched(args.part_out), launched(args.part_lse)) == buffers(ws)
    assert len(lib.launches) == 8


def test_a_misaligned_cache_is_refused_on_both_paths(case, monkeypatch) -> None:
    lib = recording_native_path(case, monkeypatch)
    kc = case.key_cache
    shifted = torch.empty(kc.numel() + 1, dtype=kc.dtype)[1:].view(kc.shape)  # 4 bytes off
    shifted.copy_(kc)
    for _ in range(2):  # the full path, then the steady one (its signature was never recorded)
        with pytest.raises(ValueError, match="key_cache and value_cache must start at 16-byte"):
            paged_decode(case.query, shifted, case.value_cache, case.block_tables,
                         case.seq_lens, 1000)  # fmt: skip
    call(case)  # aligned: recorded
    with pytest.raises(ValueError, match="key_cache and value_cache must start at 16-byte"):
        paged_decode(case.query, shifted, case.value_cache, case.block_tables, case.seq_lens,
                     1000)  # fmt: skip
    assert len(lib.launches) == 1


def test_a_steady_native_call_enters_no_resolver_file(case, monkeypatch) -> None:
    from test_steady_state import RESOLVING, attn_core_files_entered

    lib = recording_native_path(case, monkeypatch)
    ws, out = Workspace(), torch.empty_like(case.query)
    call(case, out=out, workspace=ws)  # the full path records the signature
    files, calls, _ = attn_core_files_entered(lambda: call(case, out=out, workspace=ws))
    assert not set(files) & RESOLVING, files
    assert files == ["runtime/decode.py", "runtime/decode_steady.py", "core/settings.py",
                     "decode/bounds.py", "core/workspace.py", "decode/native_step.py",
                     "native/decode.py"], files  # fmt: skip
    assert calls < 25, calls  # 17 on 2026-12-02 (the steady torch-path test allows 200)
    assert len(lib.launches) == 2
