"""Long-context suite: decode, chunked prefill and a hybrid linear-attention layer at 32K-256K
against the float64 reference.

Usage: python long_context.py --out DIR [--junit FILE] [--quick] [--device cuda|cpu]
                              [--contexts 32768,65536,...] [--dtype float16] [--repeats 10]

For each (kind, context) case it builds a random paged problem (permuted block tables,
attn_core.reference.make_paged_case), checks attn-core's output against the float64 reference
(computed per KV head so that its memory stays bounded at 256K, and in query chunks for
prefill), then times the call: median seconds, achieved bandwidth over the K/V bytes read, peak
device memory. A case that would not fit in free device memory is skipped with the numbers.

Writes OUT/long_context_metrics.json: a list of self-describing records (kind, num_seqs,
context_len, query_len, num_heads, num_kv_heads, head_size, block_size, dtype, median_s,
kv_bytes, bandwidth_bytes_per_s, peak_bytes, rel_error, max_abs_error, device, ...) which
``attn_sim calibrate`` reads; OUT/long_context_table.md; and a JUnit report (one case each).
With prefill, a whole 128K prompt is also prefilled in 8K chunks natively and by the torch path
and the two compared (long_context_prompt.py; a GPU only, skipped with the reason elsewhere).
The ``hybrid`` kind runs one Gated DeltaNet layer of the hybrid model at each context: chunked
prefill of the prompt, then one decode step from its final state, checked in float64 and timed
(long_context_hybrid.py); its records go to long_context_all.json, the table and the JUnit
report, not to long_context_metrics.json, which holds the attention steps ``attn_sim calibrate``
models.
Quick mode (--quick or HIL_QUICK=1/true/yes/on): tiny sizes on any device, seconds on a CPU.
A bad option or variable (HIL_QUICK=maybe, HIL_LC_KINDS=bogus, HIL_LC_DTYPE=bogus,
HIL_LC_CONTEXTS=abc) is a config error: one line naming it, a JUnit error case "config", exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Optional
from xml.sax.saxutils import escape, quoteattr

import torch
from suite_files import write_atomic
from suite_vars import (
    DTYPES,
    KINDS,
    SuiteConfigError,
    parse_bool,
    parse_choices,
    parse_contexts,
    parse_dtype,
)

from attn_core.core.shapes import AttentionShape

FULL_CONTEXTS = (32 * 1024, 64 * 1024, 100_000, 128 * 1024, 256 * 1024)
QUICK_CONTEXTS = (257, 1000)
# The whole-prompt case (long_context_prompt.py): a 128K prompt in 8K chunks (quick: 4K in 1K).
FULL_PROMPT, QUICK_PROMPT = (128 * 1024, 8192), (4096, 1024)
# relative L2 error of the whole output against float64; fp16/bf16 cache values are exact in
# the reference, so what remains is accumulation and output rounding (about 1e-3 for fp16)
TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 3e-2}
MEMORY_MARGIN = 2 * 1024**3  # left free for the allocator, workspace and the vendor runtime
# the kinds whose records attn_sim calibrate reads (long_context_metrics.json)
CALIBRATION_KINDS = ("decode", "prefill")


@dataclass(frozen=True)
class Shape(AttentionShape):
    """attn-core's layer shape (validated the same way) plus the prefill chunk the suite runs."""

    query_len: int = 512  # new tokens per prefill chunk


# Qwen3.6's attention layers (24 q / 4 kv heads, head 256; DESIGN.md "Shapes that matter")
FULL_SHAPE = Shape(24, 4, 256, 16, query_len=512)
QUICK_SHAPE = Shape(4, 2, 64, 16, query_len=37)


def shape_json(shape: Shape) -> dict:
    """The suite's shape in long_context_all.json (the sizes; the dtype is per record)."""
    return {
        "num_heads": shape.num_heads,
        "num_kv_heads": shape.num_kv_heads,
        "head_size": shape.head_size,
        "block_size": shape.block_size,
        "query_len": shape.query_len,
    }


def kv_bytes(kind: str, context_len: int, shape: Shape, elem: int) -> int:
    """Bytes of K and V one call must read: the cached context (+ the new chunk for prefill)."""
    tokens = context_len + (shape.query_len if kind == "prefill" else 0)
    return 2 * tokens * shape.num_kv_heads * shape.head_size * elem


def fits(kind: str, context_len: int, shape: Shape, elem: int, device: str) -> Optional[str]:
    """None when the case fits in free device memory, else why not."""
    if device != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info()
    # inputs + one transient copy of K/V (worst case of the portable path) + fp32 scores
    need = 2 * kv_bytes(kind, context_len, shape, elem)
    if kind == "prefill":
        need += 4 * shape.num_heads * shape.query_len * (context_len + shape.query_len) * 2
    if need + MEMORY_MARGIN > free:
        return f"needs about {need / 1e9:.1f} GB + margin, {free / 1e9:.1f} GB free"
    return None


def paged_case(tokens: int, shape: Shape, dtype, device: str, seed: int):
    """One sequence of ``tokens`` cached tokens in a random paged cache of ``shape``."""
    from attn_core.reference import make_paged_case

    return make_paged_case(
        [tokens],
        shape.num_heads,
        shape.num_kv_heads,
        shape.head_size,
        shape.block_size,
        dtype,
        device,
        seed=seed,
    )


def decode_plan(case, backend: Optional[str]):
    """attn-core's plan for ``case`` on its device; ``backend`` forces ``"torch"`` or
    ``"native"`` (None: what attn-core picks, the native kernel where built and verified)."""
    import attn_core

    num_seqs, heads, head_size = case.query.shape
    shape = attn_core.AttentionShape(
        heads, case.key_cache.shape[1], head_size, case.key_cache.shape[3], case.query.dtype
    )
    lengths = attn_core.DecodeLengths(num_seqs, case.max_seq_len, case.block_tables.shape[1])
    overrides = attn_core.DecodeOverrides(backend=backend) if backend else None
    return attn_core.decode_plan_for(shape, lengths, case.query.device, overrides=overrides)


def run_decode(case, out: torch.Tensor, plan) -> torch.Tensor:
    import attn_core

    return attn_core.paged_decode(
        case.query,
        case.key_cache,
        case.value_cache,
        case.block_tables,
        case.seq_lens,
        case.max_seq_len,
        out=out,
        plan=plan,
    )


def reference_decode_grouped(case) -> torch.Tensor:
    """float64 ``[num_seqs, num_heads, head_size]``, one KV head (and its query group) at a time."""
    from attn_core.reference import reference_decode

    heads, kv_heads = case.query.shape[1], case.key_cache.shape[1]
    group = heads // kv_heads
    scale = case.query.shape[-1] ** -0.5
    parts = []
    for g in range(kv_heads):
        q = case.query[:, g * group : (g + 1) * group]
        parts.append(
            reference_decode(
                q,
                case.key_cache[:, g : g + 1],
                case.value_cache[:, g : g + 1],
                case.block_tables,
                case.seq_lens,
                scale,
            )
        )
    return torch.cat(parts, dim=1)


@dataclass
class PrefillInputs:
    case: object  # PagedCase whose cache holds context + chunk blocks
    query: torch.Tensor  # [query_len, num_heads, head_size]
    key: torch.Tensor  # [query_len, num_kv_heads, head_size]
    value: torch.Tensor
    query_start_loc: torch.Tensor  # [2] int32
    context_lens: torch.Tensor  # [1] int32
    query_len: int


def prefill_case(context_len: int, shape: Shape, dtype, device: str, seed: int) -> PrefillInputs:
    q_len = shape.query_len
    case = paged_case(context_len + q_len, shape, dtype, device, seed)
    g = torch.Generator().manual_seed(seed + 1)
    mk = lambda h: torch.randn(q_len, h, shape.head_size, generator=g).to(dtype).to(device)  # noqa: E731
    return PrefillInputs(
        case=case,
        query=mk(shape.num_heads),
        key=mk(shape.num_kv_heads),
        value=mk(shape.num_kv_heads),
        query_start_loc=torch.tensor([0, q_len], dtype=torch.int32, device=device),
        context_lens=torch.tensor([context_len], dtype=torch.int32, device=device),
        query_len=q_len,
    )


def run_prefill(p: PrefillInputs, out: torch.Tensor) -> torch.Tensor:
    import attn_core

    c = p.case
    return attn_core.paged_prefix_prefill(
        p.query,
        p.key,
        p.value,
        c.key_cache,
        c.value_cache,
        c.block_tables,
        p.query_start_loc,
        c.seq_lens,
        p.context_lens,
        p.query_len,
        out=out,
    )


def reference_prefill_grouped(p: PrefillInputs, query_chunk: int) -> torch.Tensor:
    from attn_core.reference import reference_prefix_prefill

    c = p.case
    heads, kv_heads = p.query.shape[1], p.key.shape[1]
    group = heads // kv_heads
    scale = p.query.shape[-1] ** -0.5
    parts = []
    for g in range(kv_heads):
        hs, ks = slice(g * group, (g + 1) * group), slice(g, g + 1)
        parts.append(
            reference_prefix_prefill(
                p.query[:, hs],
                p.key[:, ks],
                p.value[:, ks],
                c.key_cache[:, ks],
                c.value_cache[:, ks],
                c.block_tables,
                p.query_start_loc,
                p.context_lens,
                scale,
                query_chunk=query_chunk,
            )
        )
    return torch.cat(parts, dim=1)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_calls(fn, device: str, warmup: int, repeats: int) -> list:
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return times


def errors(got: torch.Tensor, want: torch.Tensor) -> tuple:
    """(relative L2 error, max abs error); NaN anywhere (an unwritten element) gives inf."""
    got = got.detach().double().cpu()
    if not torch.isfinite(got).all():
        return float("inf"), float("inf")
    diff = got - want
    rel = float(diff.norm() / want.norm().clamp_min(1e-300))
    return rel, float(diff.abs().max())


def run_case(
    kind: str, context_len: int, shape: Shape, dtype, device: str, args, backend=None
) -> dict:
    """One measured case; ``backend`` forces decode's backend (None: attn-core's choice)."""
    elem = torch.empty((), dtype=dtype).element_size()
    rec = {
        "kind": kind,
        "backend": backend,
        "num_seqs": 1,
        "context_len": context_len,
        "query_len": shape.query_len if kind == "prefill" else 1,
        "num_heads": shape.num_heads,
        "num_kv_heads": shape.num_kv_heads,
        "head_size": shape.head_size,
        "block_size": shape.block_size,
        "dtype": str(dtype).replace("torch.", ""),
        "device": device_name(device),
        "kv_bytes": kv_bytes(kind, context_len, shape, elem),
    }
    why_not = fits(kind, context_len, shape, elem, device)
    if why_not:
        rec["skipped"] = why_not
        return rec
    if kind == "decode":
        inputs = paged_case(context_len, shape, dtype, device, args.seed)
        plan = decode_plan(inputs, backend)
        rec["backend"] = plan.backend
        call, out_shape = (lambda o: run_decode(inputs, o, plan)), inputs.query.shape
    else:
        inputs = prefill_case(context_len, shape, dtype, device, args.seed)
        call, out_shape = (lambda o: run_prefill(inputs, o)), inputs.query.shape
    out = torch.full(out_shape, float("nan"), dtype=dtype, device=device)  # poison
    got = call(out)
    sync(device)
    t0 = time.monotonic()
    if kind == "decode":
        want = reference_decode_grouped(inputs)
    else:
        want = reference_prefill_grouped(inputs, args.query_chunk)
    rec["reference_s"] = round(time.monotonic() - t0, 3)
    rec["rel_error"], rec["max_abs_error"] = errors(got, want)
    rec["tolerance"] = TOLERANCE[rec["dtype"]]
    del want
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    times = time_calls(lambda: call(out), device, args.warmup, args.repeats)
    rec["median_s"] = statistics.median(times)
    rec["min_s"] = min(times)
    rec["repeats"] = len(times)
    rec["bandwidth_bytes_per_s"] = rec["kv_bytes"] / rec["median_s"]
    if device == "cuda":
        rec["peak_bytes"] = torch.cuda.max_memory_allocated()
        rec["transient_peak_bytes"] = rec["peak_bytes"] - base
    else:
        rec["peak_bytes"] = None  # not tracked for CPU tensors
    return rec


def device_name(device: str) -> str:
    return torch.cuda.get_device_name(0) if device == "cuda" else "cpu"


def junit_xml(records: list) -> str:
    cases = []
    for r in records:
        backend = f"[{r['backend']}]" if r.get("backend") else ""
        name = f"{r['kind']}{backend}-{r['context_len']}-{r['dtype']}"
        body = ""
        if "skipped" in r:
            body = f"<skipped message={quoteattr(r['skipped'])}/>"
        elif "exception" in r:
            body = (
                f"<error message={quoteattr(r['exception'].splitlines()[-1])}>"
                f"{escape(r['exception'])}</error>"
            )
        elif not r["rel_error"] <= r["tolerance"]:
            msg = f"relative error {r['rel_error']:.3g} > {r['tolerance']:g}"
            body = f"<failure message={quoteattr(msg)}/>"
        t = r.get("median_s") or 0.0
        cases.append(
            f'<testcase classname="long-context" name={quoteattr(name)} time="{t}">'
            f"{body}</testcase>"
        )
    return (
        '<?xml version="1.0" encoding="utf-8"?>\n<testsuites><testsuite name="long-context">'
        + "".join(cases)
        + "</testsuite></testsuites>\n"
    )


def table(records: list) -> str:
    from tabulate import tabulate

    rows = []
    for r in records:
        if r["kind"] == "prompt" and "rel_error" in r:
            times = f"native {r['native_s'] * 1e3:.1f} / torch {r['torch_s'] * 1e3:.1f} ms"
            ok = "ok" if r["rel_error"] <= r["tolerance"] else "FAIL"
            rows.append(["prompt", r["backend"], r["context_len"], r["dtype"],
                         f"{r['rel_error']:.2e}", "-", "-", "-", f"{ok} ({times})"])  # fmt: skip
        elif "median_s" in r:
            peak = "-" if r.get("peak_bytes") is None else f"{r['peak_bytes'] / 1e9:.2f}"
            rows.append(
                [
                    r["kind"],
                    r.get("backend") or "-",
                    r["context_len"],
                    r["dtype"],
                    f"{r['rel_error']:.2e}",
                    f"{r['median_s'] * 1e3:.3f}",
                    f"{r['bandwidth_bytes_per_s'] / 1e9:.2f}",
                    peak,
                    "ok" if r["rel_error"] <= r["tolerance"] else "FAIL",
                ]
            )
        else:
            rows.append(
                [
                    r["kind"],
                    r.get("backend") or "-",
                    r["context_len"],
                    r["dtype"],
                    "-",
                    "-",
                    "-",
                    "-",
                    r.get("skipped") or r.get("exception", "").splitlines()[-1],
                ]
            )
    return tabulate(
        rows,
        headers=[
            "kind",
            "backend",
            "context",
            "dtype",
            "rel err",
            "median ms",
            "GB/s",
            "peak GB",
            "result",
        ],
        tablefmt="github",
    )


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("results"))
    p.add_argument("--junit", type=Path)
    # None: not given, so the HIL_* variable (or the built-in default) decides in resolve()
    p.add_argument("--quick", action="store_true", default=None, help="tiny sizes ($HIL_QUICK)")
    p.add_argument("--device", default=os.environ.get("HIL_DEVICE", ""))
    p.add_argument(
        "--contexts",
        help="comma-separated context lengths (default: $HIL_LC_CONTEXTS, else all)",
    )
    p.add_argument("--kinds", help=f"{','.join(KINDS)} (default: $HIL_LC_KINDS, else all)")
    p.add_argument(
        "--dtype",
        help=f"{' | '.join(DTYPES)} (default: $HIL_LC_DTYPE, else float16 on cuda, float32 on cpu)",
    )
    p.add_argument("--repeats", type=int, default=0)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument(
        "--query-chunk",
        type=int,
        default=128,
        help="reference queries per float64 block: 6 heads x 128 x 256K x 8 B = 1.6 GB",
    )
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def _pick(option: str, value, variable: str, environ) -> tuple:
    """(name to blame, raw text): the option when given, else the environment variable."""
    if value is not None:
        return option, value
    return variable, environ.get(variable, "")


def resolve(args, environ=None) -> None:
    """Fill args.quick / kinds / contexts / dtype from options, then HIL_* variables, then the
    defaults; SuiteConfigError naming the option or variable when a value is bad."""
    environ = os.environ if environ is None else environ
    if args.quick is None:
        args.quick = parse_bool("HIL_QUICK", environ.get("HIL_QUICK"), False)
    name, raw = _pick("--kinds", args.kinds, "HIL_LC_KINDS", environ)
    args.kinds = parse_choices(name, raw, KINDS) if raw.strip() else list(KINDS)
    name, raw = _pick("--contexts", args.contexts, "HIL_LC_CONTEXTS", environ)
    args.contexts = parse_contexts(name, raw)
    name, raw = _pick("--dtype", args.dtype, "HIL_LC_DTYPE", environ)
    args.dtype = parse_dtype(name, raw)
    if args.device not in ("", "cpu", "cuda") and not args.device.startswith("cuda:"):
        raise SuiteConfigError(f"--device / HIL_DEVICE must be cpu or cuda, got {args.device!r}")


def config_error(args, message: str) -> int:
    """One line on stderr, a JUnit error case named "config" (so the host's report says what
    was wrong instead of "no tests ran"), exit 2."""
    print(f"long-context: config error: {message}", file=sys.stderr, flush=True)
    if args.junit:
        args.junit.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(
            args.junit,
            '<?xml version="1.0" encoding="utf-8"?>\n<testsuites><testsuite name="long-context">'
            '<testcase classname="long-context" name="config">'
            f"<error message={quoteattr('config error: ' + message)}/></testcase>"
            "</testsuite></testsuites>\n",
        )
    return 2


def prompt_case(shape: Shape, dtype, device: str, args) -> dict:
    """A whole prompt prefilled natively and by the torch path, compared (GPU only)."""
    from long_context_prompt import prompt_record

    prompt, chunk = QUICK_PROMPT if args.quick else FULL_PROMPT
    print(f"[long-context] whole prompt {prompt} in {chunk} chunks, native vs torch", flush=True)
    try:
        rec = prompt_record(prompt, chunk, shape, dtype, device, args.seed)
    except Exception:
        rec = {"kind": "prompt", "backend": "native vs torch", "context_len": prompt,
               "dtype": str(dtype).replace("torch.", ""),
               "exception": traceback.format_exc()}  # fmt: skip
        print(rec["exception"], flush=True)
    rec["tolerance"] = TOLERANCE[str(dtype).replace("torch.", "")]
    return rec


def hybrid_case(context: int, dtype, device: str, args) -> dict:
    """One hybrid linear-attention layer case (long_context_hybrid.py), with its tolerance."""
    from long_context_hybrid import hybrid_record

    rec = hybrid_record(context, args.quick, dtype, device, args, MEMORY_MARGIN)
    rec["tolerance"] = TOLERANCE[str(dtype).replace("torch.", "")]
    return rec


def measure(kind: str, context: int, shape: Shape, dtype, device: str, args, backend) -> dict:
    if kind == "hybrid":
        return hybrid_case(context, dtype, device, args)
    return run_case(kind, context, shape, dtype, device, args, backend)


def runs(kinds: list, device: str) -> list:
    """``(kind, backend)`` pairs: decode as attn-core picks it and, on a GPU, the torch path
    beside it (the native kernel's reference point); prefill and hybrid once."""
    out = []
    for kind in kinds:
        out.append((kind, None))
        if kind == "decode" and device.startswith("cuda"):
            out.append((kind, "torch"))
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        resolve(args)
    except SuiteConfigError as exc:
        return config_error(args, str(exc))
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    shape = QUICK_SHAPE if args.quick else FULL_SHAPE
    contexts = args.contexts or list(QUICK_CONTEXTS if args.quick else FULL_CONTEXTS)
    dtype_name = args.dtype or ("float16" if device == "cuda" else "float32")
    dtype = getattr(torch, dtype_name)
    args.repeats = args.repeats or (3 if args.quick else 10)
    args.out.mkdir(parents=True, exist_ok=True)
    records = []
    for kind, backend in runs(args.kinds, device):
        for ctx in contexts:
            what = f"{kind} ({backend} backend)" if backend else kind
            print(f"[long-context] {what} context {ctx} {dtype_name} on {device}", flush=True)
            try:
                rec = measure(kind, ctx, shape, dtype, device, args, backend)
            except Exception:
                rec = {
                    "kind": kind,
                    "backend": backend,
                    "context_len": ctx,
                    "dtype": dtype_name,
                    "exception": traceback.format_exc(),
                }
                print(rec["exception"], flush=True)
            if (
                backend
                and rec.get("backend") == "torch"
                and any(r.get("backend") == "torch" and r["context_len"] == ctx for r in records)
            ):
                continue  # attn-core's own choice was already the torch path
            records.append(rec)
            if device == "cuda":
                torch.cuda.empty_cache()
            measured = [r for r in records if "median_s" in r and r["kind"] in CALIBRATION_KINDS]
            write_atomic(args.out / "long_context_metrics.json", json.dumps(measured, indent=1))
    if "prefill" in args.kinds:
        records.append(prompt_case(shape, dtype, device, args))
    text = table(records)
    print(text, flush=True)
    write_atomic(args.out / "long_context_table.md", text + "\n")
    write_atomic(
        args.out / "long_context_all.json",
        json.dumps({"shape": shape_json(shape), "records": records}, indent=1),
    )
    if args.junit:
        write_atomic(args.junit, junit_xml(records))
    bad = [
        r
        for r in records
        if "exception" in r or ("rel_error" in r and not r["rel_error"] <= r["tolerance"])
    ]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
