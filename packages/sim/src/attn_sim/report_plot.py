"""``report.png``: five panels over context: decode and prefill time, memory against the device's,
waves, and shared memory per block against the budget.

The time panels show what runs, graph and eager apart: decode on the native kernel (the report's
first table, the default where it is built) and on the torch path, both as a CUDA graph replays
them; prefill on the torch path, eager. The other panels are the traced torch path's
(``results``, one :meth:`CaseResult.to_json` per case). Every panel has a title and its own
legend; red is the device's limits alone, and a case whose memory does not fit the device is a
red cross. Memory is one layer's, in GiB.
"""

from __future__ import annotations

import io
from pathlib import Path

from attn_core.core.files import write_atomic
from attn_sim.report_text import shape_text

DECODE_TIME_TITLE = "Decode time per layer (CUDA graph replay)"
PREFILL_TIME_TITLE = "Prefill time per layer (eager, torch path)"
MEMORY_TITLE = "Memory per layer: K+V + transient"
WAVES_TITLE = "Waves of the largest launch (torch path)"
SMEM_TITLE = "Shared memory per block (torch path)"
# (title, y label, y scale): graph and eager times in panels of their own (never compared on one
# axis: a graph replay has no host issue time).
PANELS = (
    (DECODE_TIME_TITLE, "ms per step", "log"),
    (PREFILL_TIME_TITLE, "ms per step", "log"),
    (MEMORY_TITLE, "GiB per layer", "log"),
    (WAVES_TITLE, "waves", "log"),
    (SMEM_TITLE, "bytes per block", "linear"),
)
LIMIT = "red"  # the device's limits; no data line takes it (see DATA_COLOURS)
# matplotlib's tab10 without its red (C3), so a data line is never read as a limit.
DATA_COLOURS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
    "#17becf",
)  # fmt: skip
# Context ticks: the ends of the report's range (1K, 1M), and what a reader looks for: the design
# target (100K) and the prompts of the TTFT table (32K, 256K).
CONTEXT_TICKS = {
    1024: "1K",
    8 * 1024: "8K",
    32 * 1024: "32K",
    100 * 1024: "100K",
    256 * 1024: "256K",
    1024 * 1024: "1M",
}
OVER_MEMORY = {"marker": "x", "color": LIMIT, "s": 60, "zorder": 5}
GIB = 2**30


def _value(result: dict, key: str) -> float:
    if key == "memory_gib":
        return (result["kv_bytes"] + result["transient_bytes"]) / GIB
    return result[key]


def _over(result: dict, memory_bytes: int) -> bool:
    return result["kv_bytes"] + result["transient_bytes"] > memory_bytes


def _limit(ax, y: float, text: str) -> None:
    """A :data:`LIMIT` horizontal line at ``y``, labelled at its left end."""
    ax.axhline(y, color=LIMIT, linewidth=1.5)
    ax.annotate(text, (0.02, y), xycoords=("axes fraction", "data"), color=LIMIT, va="bottom")


def plot(report: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig = figure(report)
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    write_atomic(path, png.getvalue())


def _series(ax, points: list, style: str, label: str, over: list) -> list:
    """One line; returns the points beyond device memory (drawn apart by the caller)."""
    ax.plot([x for x, _ in points], [y for _, y in points], style, markersize=3, label=label)
    return [p for p, o in zip(points, over, strict=True) if o]


def _decode_time_panel(ax, report: dict) -> list:
    """Decode as a CUDA graph replays it: the native kernel and the torch path."""
    beyond = []
    native = [r for r in report.get("native", []) if "native_ms" in r]
    for batch in sorted({r["batch"] for r in native}):
        sel = sorted((r for r in native if r["batch"] == batch), key=lambda r: r["context"])
        over = [not r["fits_device_memory"] for r in sel]
        pts = [(r["context"], r["native_ms"]) for r in sel]
        beyond += _series(ax, pts, "-o", f"decode native b{batch} (graph)", over)
    return beyond + _torch_times(ax, report, "decode", "--s", "graph_time_s", "torch path, graph")


def _prefill_time_panel(ax, report: dict) -> list:
    return _torch_times(ax, report, "prefill", ":^", "time_s", "torch path, eager")


def _torch_times(ax, report: dict, path_name: str, style: str, key: str, how: str) -> list:
    beyond = []
    rows = [r for r in report["results"] if r["path"] == path_name]
    for batch in sorted({r["num_seqs"] for r in rows}):
        sel = sorted((r for r in rows if r["num_seqs"] == batch), key=lambda r: r["context"])
        pts = [(r["context"], r[key] * 1e3) for r in sel]
        over = [_over(r, report["memory_bytes"]) for r in sel]
        beyond += _series(ax, pts, style, f"{path_name} b{batch} ({how})", over)
    return beyond


def _traced_panel(ax, report: dict, key: str) -> list:
    beyond = []
    for path_name, style in (("decode", "-o"), ("prefill", "--s")):
        rows = [r for r in report["results"] if r["path"] == path_name]
        for batch in sorted({r["num_seqs"] for r in rows}):
            sel = sorted((r for r in rows if r["num_seqs"] == batch), key=lambda r: r["context"])
            pts = [(r["context"], _value(r, key)) for r in sel]
            over = [_over(r, report["memory_bytes"]) for r in sel]
            beyond += _series(ax, pts, style, f"{path_name} b{batch}", over)
    return beyond


def figure(report: dict):
    """The matplotlib figure (Agg backend): :data:`PANELS` in a 3 x 2 grid, the sixth cell
    hidden."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from cycler import cycler
    from matplotlib.ticker import NullLocator

    with plt.rc_context({"axes.prop_cycle": cycler(color=DATA_COLOURS)}):
        fig, axes = plt.subplots(3, 2, figsize=(13, 13))
        draw = {
            DECODE_TIME_TITLE: lambda ax: _decode_time_panel(ax, report),
            PREFILL_TIME_TITLE: lambda ax: _prefill_time_panel(ax, report),
            MEMORY_TITLE: lambda ax: _traced_panel(ax, report, "memory_gib"),
            WAVES_TITLE: lambda ax: _traced_panel(ax, report, "max_waves"),
            SMEM_TITLE: lambda ax: _traced_panel(ax, report, "smem_max"),
        }
        for ax, (title, label, yscale) in zip(axes.flat[: len(PANELS)], PANELS, strict=True):
            beyond = draw[title](ax)
            if beyond:
                xs, ys = [x for x, _ in beyond], [y for _, y in beyond]
                ax.scatter(xs, ys, label="beyond device memory", **OVER_MEMORY)
            ax.set_title(title, fontsize=10)
            ax.set_xscale("log", base=2)
            ax.set_yscale(yscale)
            ax.set_xlabel("context (tokens)")
            ax.set_ylabel(label)
            ax.grid(True, which="both", alpha=0.3)
        axes.flat[-1].set_visible(False)
        panel = dict(zip([t for t, _, _ in PANELS], axes.flat[: len(PANELS)], strict=True))
        results = report["results"]
        memory = report["memory_bytes"]
        _limit(panel[MEMORY_TITLE], memory / GIB, f"device memory {memory / GIB:.1f} GiB")
        smem_ax = panel[SMEM_TITLE]
        budgets = sorted({r["smem_budget"] for r in results})
        for budget in budgets:
            _limit(smem_ax, budget, f"per-block budget {budget:,} B")
        smem_ax.set_ylim(0, 1.12 * max(budgets + [r["smem_max"] for r in results]))
        for ax in panel.values():
            ax.set_xticks(list(CONTEXT_TICKS), list(CONTEXT_TICKS.values()))
            ax.xaxis.set_minor_locator(NullLocator())  # no unlabelled powers of two between
            ax.legend(fontsize=6, ncol=2)
        fig.suptitle(
            f"attn-core on simulated {report['profile']} ({shape_text(report['shape'])}): "
            "decode native kernel and torch path, prefill torch path"
        )
        fig.tight_layout()
    return fig
