"""attn-core's decode tiers (and the native kernel, where built and verified) at the shapes
around the tier threshold, timed so the tier rule can be fitted on the device.

Shape: Qwen3.6's attention (24 q / 4 kv heads, head 256, block 16, fp16), ``batch`` sequences
all at ``context`` tokens, block tables a random permutation. Each variant is timed eager
(CUDA events around one call, median) and replayed from a CUDA graph (device time, how vLLM
runs decode); a capture that fails leaves ``graph_s`` null with the reason. Rows are the
``decode_tiers`` fact ``attn_sim.facts`` reads: ``{"shape", "tier", "graph_s", "eager_s"}``
plus the plan's partitions and ``plan_picks``, the tier attn-core's torch path picks unforced
(the rule being fitted; on a GPU the default backend is the native kernel, timed in rows of its
own). Tiers are forced through explicit plans (``DecodeOverrides``), never the environment.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import torch
from device_facts_rates import event_median_s

HEADS, KV_HEADS, HEAD, BLOCK = 24, 4, 256, 16
TIERS = ("one_pass", "partitioned")


def plan_for(batch: int, context: int, device: torch.device, **overrides):
    """attn-core's plan for ``batch`` x ``context`` under ``DecodeOverrides(**overrides)``."""
    import attn_core

    return attn_core.decode_plan_for(
        attn_core.AttentionShape(HEADS, KV_HEADS, HEAD, BLOCK, torch.float16),
        attn_core.DecodeLengths(batch, context, -(-context // BLOCK)),
        device,
        overrides=attn_core.DecodeOverrides(**overrides),
    )


def plan_info(plan) -> dict:
    return {"tier": plan.tier, "partition_size": plan.partition_size,
            "num_partitions": plan.num_partitions}  # fmt: skip


@dataclasses.dataclass
class Case:
    query: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    context: int


class Caches:
    """One K/V pool for a batch at the longest context; shorter contexts use a prefix."""

    def __init__(self, batch: int, max_context: int, device: torch.device) -> None:
        per_seq = -(-max_context // BLOCK)
        blocks = batch * per_seq + 1
        self.batch, self.device = batch, device
        self.key_cache = torch.empty(blocks, KV_HEADS, HEAD // 8, BLOCK, 8, dtype=torch.float16,
                                     device=device).normal_()  # fmt: skip
        self.value_cache = torch.empty(blocks, KV_HEADS, HEAD, BLOCK, dtype=torch.float16,
                                       device=device).normal_()  # fmt: skip
        self.perm = torch.randperm(blocks, device=device)
        self.query = torch.randn(batch, HEADS, HEAD, device=device).half()

    def case(self, context: int) -> Case:
        nb = -(-context // BLOCK)
        tables = self.perm[: self.batch * nb].view(self.batch, nb).to(torch.int32)
        lens = torch.full((self.batch,), context, dtype=torch.int32, device=self.device)
        return Case(self.query, self.key_cache, self.value_cache, tables, lens, context)


def time_eager(fn, device: torch.device, repeats: int) -> float:
    """Median seconds of one call: CUDA events on a GPU, the host clock elsewhere."""
    if device.type == "cuda":
        return event_median_s(fn, repeats, warmup=2)
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_graph(fn, device: torch.device, repeats: int) -> tuple:
    """(median replay seconds or None, why None)."""
    if device.type != "cuda":
        return None, "no CUDA graphs off CUDA"
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        t = time_eager(graph.replay, device, repeats)
    except RuntimeError as exc:
        try:
            torch.cuda.synchronize(device)
        except RuntimeError:  # a failed capture can leave an error to collect; the row says why
            pass
        return None, f"capture or replay raised: {exc}"[:300]
    del graph
    return t, None


def attn_core_call(c: Case, out: torch.Tensor, plan):
    """One decode step on ``plan`` with a workspace of its own, so a graph captured over it
    never shares scratch buffers with the next variant's eager calls."""
    import attn_core
    from attn_core.core.workspace import Workspace

    ws = Workspace()
    return lambda: attn_core.paged_decode(
        c.query, c.key_cache, c.value_cache, c.block_tables, c.seq_lens, c.context, out=out,
        workspace=ws, plan=plan,
    )  # fmt: skip


def native_library(device: torch.device) -> tuple:
    """(library or None, why not): built (prebuilt or cached: no build here) and verified."""
    from attn_core.core.settings import current_overrides
    from attn_core.core.shapes import AttentionShape
    from attn_core.native.decode import DecodeLibrary, variant_for
    from attn_core.native.loader import load_library, verify

    group = HEADS // KV_HEADS
    settings = dataclasses.replace(current_overrides().native, build=False)
    lib, status = load_library(DecodeLibrary, variant_for(group), settings, device)
    if lib is None:
        return None, f"not built: {status.detail}"
    verdict = verify(lib, device, AttentionShape(HEADS, KV_HEADS, HEAD, BLOCK, torch.float16))
    if not verdict.ok:
        return None, f"built ({status.detail}) but not verified: {verdict.detail}"
    return lib, f"{status.detail}, {status.platform}, verified: {verdict.detail}"


def native_kernels(lib, why: str, device: torch.device) -> dict:
    """The library's kernels as the driver reports them, each beside the ``kernel_facts.json``
    record this device's plans are sized from (``attn_core.native.decode.kernel_rows``): on the
    lab's BI-V100, CoreX's own registers and shared memory against the nvcc stand-in; absent,
    saying why, without a library."""
    from device_facts_record import absent, measured

    if lib is None:
        return absent("", f"no native library: {why}")
    from attn_core import detect_device_spec
    from attn_core.native.decode import COLUMNS, kernel_rows

    spec = detect_device_spec(device)
    table = kernel_rows(lib, HEADS // KV_HEADS, spec)
    rows = [dict(zip(COLUMNS, row, strict=True)) for row in table]
    method = (
        "attn_core.native.decode.kernel_rows: the driver's attributes of the group-"
        f"{HEADS // KV_HEADS} library's kernels (same-type caches, every head bucket) beside "
        "kernel_facts.json's record for this device (marked '(differs)')"
    )
    return measured(rows, "", method)


def native_call(lib, c: Case, out: torch.Tensor, partition_size: int):
    from attn_core.native.abi import partials_shapes
    from attn_core.native.decode import launch_decode

    parts = -(-c.context // partition_size)
    o_shape, l_shape = partials_shapes(c.query.shape[0], HEADS, parts, HEAD)
    dev = c.query.device
    part_out = torch.empty(o_shape, device=dev) if parts > 1 else None
    part_lse = torch.empty(l_shape, device=dev) if parts > 1 else None
    return lambda: launch_decode(
        lib, query=c.query, key_cache=c.key_cache, value_cache=c.value_cache,
        block_tables=c.block_tables, seq_lens=c.seq_lens, out=out, scale=HEAD**-0.5,
        v_scale=1.0, kv_cache_dtype="auto", num_partitions=parts, partition_size=partition_size,
        part_out=part_out, part_lse=part_lse,
    )  # fmt: skip


def _row(batch: int, context: int, tier: str, fn, device, repeats: int, **extra) -> dict:
    row = {"shape": {"num_seqs": batch, "context": context}, "tier": tier, **extra}
    try:
        row["eager_s"] = time_eager(fn, device, repeats)
    except RuntimeError as exc:
        row["eager_s"], row["error"] = None, f"{exc}"[:300]
        return row
    row["graph_s"], why = time_graph(fn, device, repeats)
    if why:
        row["graph_error"] = why
    return row


def measure_tiers(batches, contexts, repeats: int, device: torch.device, native=None) -> list:
    """Rows for every (batch, context): each attn-core tier, then the native kernel's one
    partition and the plan's partitioning when ``native`` (a loaded library) is given."""
    rows = []
    for batch in batches:
        pool = Caches(batch, max(contexts), device)
        for context in contexts:
            c = pool.case(context)
            out = torch.empty_like(c.query)
            picks = plan_for(batch, context, device, backend="torch").tier
            for tier in TIERS:
                plan = plan_for(batch, context, device, tier=tier)
                info = plan_info(plan)
                extra = {k: v for k, v in info.items() if k != "tier"}
                if plan.tier != tier:  # the override did not take
                    extra["planned_tier"] = plan.tier
                rows.append(_row(batch, context, tier, attn_core_call(c, out, plan), device,
                                 repeats, plan_picks=picks, **extra))  # fmt: skip
            if native is not None:
                whole = -(-context // BLOCK) * BLOCK
                native_plan = plan_for(batch, context, device, backend="native")
                for tier, ps in (("native_one_pass", whole),
                                 ("native_partitioned", native_plan.partition_size)):  # fmt: skip
                    if ps:
                        fn = native_call(native, c, out, ps)
                        rows.append(_row(batch, context, tier, fn, device, repeats,
                                         partition_size=ps, num_partitions=-(-context // ps),
                                         plan_picks=picks))  # fmt: skip
            print(f"[device-facts] tiers batch {batch} context {context}: "
                  + ", ".join(_brief(r) for r in rows if r["shape"] == {"num_seqs": batch,
                              "context": context}), flush=True)  # fmt: skip
        del pool
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def _brief(row: dict) -> str:
    ms = lambda t: "-" if t is None else f"{t * 1e3:.3f}"  # noqa: E731
    return f"{row['tier']} {ms(row.get('graph_s'))}/{ms(row.get('eager_s'))} ms"
