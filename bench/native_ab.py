"""Two or more builds of the decode library, timed on the same inputs in interleaved rounds: a
change's effect beside the device's drift.

    python3 bench/native_ab.py NAME=LIB NAME=LIB [...] [--shapes 6/1/1x102400,...] [--rounds 9]
    python3 bench/native_ab.py old=DIR new=DIR --dtype float32 --shapes 16/4/1x102400,32/4/8x32768

Each ``LIB`` is a ``libattn_native_g6.so`` (``bench/native_tune.py``'s tuning builds, or one
built by hand from another revision's ``csrc/``), or a directory of libraries (a build cache
directory, or ``attn_core.native.build.build_variant``'s output for several slot counts): each
row then takes the library of its group's slot count, so ``--shapes`` may hold any group.
``--dtype`` picks the queries' dtype (the cache holds it unless a row names fp8). Rows default
to native_decode_bench.py's fp16 rows; every build runs the plan's own split (what attn-core
launches for the row's dtype; ``--body cuda_core`` for portable ``-DATTN_DECODE_MMA=0`` builds,
which run the CUDA-core body where the device's plan would split for the matrix-unit one: 33
partitions of one four-warp block a SM at 24 / 4 heads 1 x 100K on the H200, against the
CUDA-core split's 115 at four blocks a SM), each step captured
in a CUDA graph and replayed back to back (``_timing.graph_ms``), the builds' order rotated per
round so that none is always first after another's replays. ``--facts NAME=FILE`` plans that
build's split from another ``kernel_facts.json`` (its own build's, where a change moved the
registers or shared memory the split is sized from): each build then runs at its own split, and
the table gains each build's partition count. Prints, per row, each build's median
and best over the rounds and its difference from the first build, plus each build's largest
error against a float64 reference; writes ``native_ab.json``. One run of a shape's graphs moves
tenths of a microsecond between rounds on the H200 (docs/benchmarks.md#decode-kernel-choices):
read differences below that as no difference. Measures, never asserts.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _args import positive_int  # noqa: E402
from _timing import copy_bandwidth, device_info, graph_ms, print_table, write_results  # noqa: E402
from native_decode_bench import (  # noqa: E402
    ROWS,
    native_step,
    parse_shapes,
    plan_split,
    reference,
    step_caches,
)

from attn_core.native.facts import CUDA_CORE, MMA, recorded_in  # noqa: E402

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
BODIES = (CUDA_CORE, MMA)  # the partition bodies --body may force


def any_group_shapes(text: str) -> tuple:
    """``--shapes``: native_decode_bench.py's syntax, rows of any GQA group."""
    return parse_shapes(text, group=None)


def parse_builds(items: list[str]) -> list[tuple[str, Path]]:
    """``["old=a/lib.so", "new=b/lib.so"]`` -> ``[("old", Path("a/lib.so")), ...]``."""
    builds = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise argparse.ArgumentTypeError(f"expected NAME=LIB, got {item!r}")
        builds.append((name, Path(path)))
    if len(builds) < 2:
        raise argparse.ArgumentTypeError(f"need two builds or more, got {len(builds)}")
    return builds


def parse_facts_files(items: list[str], names: list[str]) -> dict[str, Path]:
    """``--facts`` values ``["new=f.json"]`` -> ``{"new": Path("f.json")}``, each naming a build
    given and an existing file."""
    files: dict[str, Path] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise argparse.ArgumentTypeError(f"--facts: expected NAME=FILE, got {item!r}")
        if name not in names:
            raise argparse.ArgumentTypeError(f"--facts: no build named {name!r} (builds: {names})")
        if not Path(path).is_file():
            raise argparse.ArgumentTypeError(f"--facts {name}: no file {path}")
        files[name] = Path(path)
    return files


def build_splits(
    specs: tuple,
    dtype: torch.dtype,
    body: Optional[str],
    names: list[str],
    files: dict[str, Path],
    spec: Any = None,
) -> list[dict[str, tuple[int, int]]]:
    """Each row's split for each build on ``spec`` (default: this GPU's): from its ``--facts``
    file where it has one, else from the shipped facts (``plan_split``).

    Raises:
        ValueError: a row has no recorded kernel for the body, or a file is not a facts file.
    """
    shipped = [plan_split(row, dtype, body, spec) for row in specs]
    own = {}
    for name, path in files.items():
        with recorded_in(path):
            own[name] = [plan_split(row, dtype, body, spec) for row in specs]
    return [{n: own[n][i] if n in own else shipped[i] for n in names} for i in range(len(specs))]


def library_path(build: Path, group: int) -> Path:
    """The library of ``build`` that serves a GQA ``group``: ``build`` itself when it is a file,
    else its ``libattn_native_g<slots>.so``."""
    from attn_core.native.decode import variant_for
    from attn_core.native.family import DECODE

    return build / DECODE.library_name(variant_for(group)) if build.is_dir() else build


def load_libraries(builds: list[tuple[str, Path]], specs: tuple) -> dict[tuple[str, int], Any]:
    """Each build's library for each group in ``specs``, keyed ``(name, group)``.

    Raises:
        ValueError: a library is missing or serves another slot count than a row's group needs
            (the message names the build, the row's heads and both counts), or does not load.
    """
    from attn_core.native.decode import DecodeLibrary, group_slots

    libs: dict[tuple[str, int], Any] = {}
    for name, build in builds:
        for heads, kv_heads, *_ in specs:
            group = heads // kv_heads
            if (name, group) in libs:
                continue
            path = library_path(build, group)
            if not path.is_file():
                raise ValueError(f"build {name}: no library {path} for {heads}/{kv_heads} heads")
            try:
                lib = DecodeLibrary(path)
            except OSError as exc:  # not a library, or another ABI's
                raise ValueError(f"build {name}: {path} does not load: {exc}") from None
            if lib.slots != group_slots(group):
                raise ValueError(
                    f"build {name}: {path} serves {lib.slots} head slots, {heads}/{kv_heads} "
                    f"heads need {group_slots(group)}"
                )
            libs[(name, group)] = lib
    return libs


def ab_row(
    libs: dict[str, Any],
    spec: tuple,
    rounds: int,
    copy_bw: float,
    dtype: torch.dtype,
    splits: dict[str, tuple[int, int]],
) -> dict[str, Any]:
    """One row timed for every build at its split (``splits[name]``: ``(num_partitions,
    partition_size)``)."""
    heads, kv_heads, batch, tokens, cache = spec
    cases = step_caches(spec, dtype)
    one = cases[0]
    k, v = one.contiguous_kv()
    want = reference(one, k, v)
    del k, v
    names = list(libs)
    times: dict[str, list[float]] = {n: [] for n in names}
    errors = {}
    for name in names:
        one.out.fill_(float("nan"))  # a launch that writes nothing shows as NaN, not stale data
        got = native_step(libs[name], one, *splits[name])().float()
        errors[name] = float((got - want).abs().max())
    steps = {n: [native_step(libs[n], c, *splits[n]) for c in cases] for n in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(graph_ms(steps[name])[0])
    floor = one.kv_bytes / copy_bw * 1e3
    row: dict[str, Any] = {"heads": f"{heads}/{kv_heads}", "shape": f"{batch}x{tokens}",
                           "dtype": str(dtype).replace("torch.", ""), "kv_cache": cache,
                           "parts": splits[names[0]][0], "floor_ms": floor}  # fmt: skip
    base = statistics.median(times[names[0]])
    for name in names:
        row[f"{name}_parts"] = splits[name][0]
        med = statistics.median(times[name])
        row[f"{name}_ms"] = med
        row[f"{name}_best"] = min(times[name])
        row[f"{name}_x_floor"] = med / floor
        if name != names[0]:
            row[f"{name}_minus_{names[0]}_us"] = (med - base) * 1e3
        row[f"{name}_err"] = errors[name]
    row["rounds"] = {n: times[n] for n in names}
    del cases, one, steps
    torch.cuda.empty_cache()
    return row


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("builds", nargs="+", help="NAME=LIB.so or NAME=DIR of libraries, two or more")
    ap.add_argument("--shapes", type=any_group_shapes, default=(),
                    help="as native_decode_bench.py, any group (from a DIR build)")  # fmt: skip
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float16", help="query dtype")
    ap.add_argument("--body", choices=BODIES, default=None,
                    help="split for this partition body (default: the one the device runs; "
                    "cuda_core for -DATTN_DECODE_MMA=0 builds)")  # fmt: skip
    ap.add_argument("--facts", action="append", default=[], metavar="NAME=FILE",
                    help="plan build NAME from this kernel_facts.json (repeatable)")  # fmt: skip
    ap.add_argument("--rounds", type=positive_int, default=9)
    ap.add_argument("--out", default="results")
    args = ap.parse_args(argv)
    try:
        builds = parse_builds(args.builds)
        names = [n for n, _ in builds]
        facts_files = parse_facts_files(args.facts, names)
    except argparse.ArgumentTypeError as exc:
        ap.error(str(exc))
    if not torch.cuda.is_available():
        print("native_ab: needs a CUDA device; nothing measured")
        return 0
    specs = args.shapes or tuple(r for r in ROWS if r[4] == "auto")
    try:
        by_group = load_libraries(builds, specs)
        # every row's split before anything runs: a --body its dtype has no kernel for is named
        splits = build_splits(specs, DTYPES[args.dtype], args.body, names, facts_files)
    except ValueError as exc:
        ap.error(str(exc))
    bw = copy_bandwidth(torch.device("cuda"))
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s (read + write)", flush=True)
    rows = []
    columns = ["heads", "shape", "dtype"] + ([] if facts_files else ["parts"]) + ["floor_ms"]
    for n in names:
        columns += [f"{n}_parts"] if facts_files else []
        columns += [f"{n}_ms", f"{n}_x_floor"]
        if n != names[0]:
            columns.append(f"{n}_minus_{names[0]}_us")
    columns += [f"{n}_err" for n in names]
    for spec, split in zip(specs, splits, strict=True):
        group = spec[0] // spec[1]
        libs = {name: by_group[(name, group)] for name in names}
        rows.append(ab_row(libs, spec, args.rounds, bw, DTYPES[args.dtype], split))
        print_table([rows[-1]], columns)
        payload = {"device": device_info(torch.device("cuda")), "copy_bandwidth": bw,
                   "builds": {n: str(p) for n, p in builds}, "body": args.body or "plan's",
                   "facts": {n: str(p) for n, p in facts_files.items()},
                   "rows": rows}  # fmt: skip
        write_results(args.out, "native_ab.json", payload)
    print(f"\n== medians over {args.rounds} interleaved rounds (ms; *_minus_*_us: microseconds)")
    print_table(rows, columns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
