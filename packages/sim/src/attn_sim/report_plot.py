"""``report.png``: four panels over context: predicted time, memory against the device's, waves,
and shared memory per block against the budget.

The time panel shows what runs: decode on the native kernel (the report's first table, the
default where it is built) and on the torch path, both as a CUDA graph replays them; prefill on
the torch path, eager. The other panels are the traced torch path's (``results``, one
:meth:`CaseResult.to_json` per case). Every panel has its own legend; a case whose memory does
not fit the device is drawn as a red cross. Memory is in bytes, the unit of the assumptions
table's ``memory_bytes``.
"""

from __future__ import annotations

from pathlib import Path

from attn_sim.report_text import shape_text

PANELS = (
    ("time_ms", "predicted time per step (ms)", "log"),
    ("memory_bytes", "K+V + transient memory (bytes)", "log"),
    ("max_waves", "waves of the largest launch (torch path)", "log"),
    ("smem_max", "shared memory per block (bytes, torch path)", "linear"),
)
OVER_MEMORY = {"marker": "x", "color": "red", "s": 60, "zorder": 5}


def _value(result: dict, key: str) -> float:
    if key == "memory_bytes":
        return result["kv_bytes"] + result["transient_bytes"]
    return result[key]


def _over(result: dict, memory_bytes: int) -> bool:
    return result["kv_bytes"] + result["transient_bytes"] > memory_bytes


def _limit(ax, y: float, text: str) -> None:
    """A red horizontal line at ``y``, labelled at its left end."""
    ax.axhline(y, color="red", linewidth=1.5)
    ax.annotate(text, (0.02, y), xycoords=("axes fraction", "data"), color="red", va="bottom")


def plot(report: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig = figure(report)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _series(ax, points: list, style: str, label: str, over: list) -> list:
    """One line; returns the points beyond device memory (drawn apart by the caller)."""
    ax.plot([x for x, _ in points], [y for _, y in points], style, markersize=3, label=label)
    return [p for p, o in zip(points, over, strict=True) if o]


def _time_panel(ax, report: dict) -> list:
    beyond = []
    native = [r for r in report.get("native", []) if "native_ms" in r]
    for batch in sorted({r["batch"] for r in native}):
        sel = sorted((r for r in native if r["batch"] == batch), key=lambda r: r["context"])
        over = [not r["fits_device_memory"] for r in sel]
        pts = [(r["context"], r["native_ms"]) for r in sel]
        beyond += _series(ax, pts, "-o", f"decode native b{batch} (graph)", over)
    results = report["results"]
    for path_name, style, key, how in (
        ("decode", "--s", "graph_time_s", "torch path, graph"),
        ("prefill", ":^", "time_s", "torch path, eager"),
    ):
        rows = [r for r in results if r["path"] == path_name]
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
    """The 2 x 2 matplotlib figure (Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    results = report["results"]
    for ax, (key, label, yscale) in zip(axes.flat, PANELS, strict=True):
        beyond = _time_panel(ax, report) if key == "time_ms" else _traced_panel(ax, report, key)
        if beyond:
            xs, ys = [x for x, _ in beyond], [y for _, y in beyond]
            ax.scatter(xs, ys, label="beyond device memory", **OVER_MEMORY)
        ax.set_xscale("log", base=2)
        ax.set_yscale(yscale)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    ax_mem, ax_smem = axes.flat[1], axes.flat[3]
    memory = report["memory_bytes"]
    _limit(ax_mem, memory, f"device memory_bytes {memory:,} ({memory / 2**30:.1f} GiB)")
    budgets = sorted({r["smem_budget"] for r in results})
    for budget in budgets:
        _limit(ax_smem, budget, f"per-block budget {budget:,} B")
    ax_smem.set_ylim(0, 1.12 * max(budgets + [r["smem_max"] for r in results]))
    for ax in axes.flat:
        ax.legend(fontsize=6, ncol=2)
    fig.suptitle(
        f"attn-core on simulated {report['profile']} ({shape_text(report['shape'])}): decode "
        "native kernel and torch path, prefill torch path"
    )
    fig.tight_layout()
    return fig
