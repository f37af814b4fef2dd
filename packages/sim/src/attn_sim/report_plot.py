"""``report.png``: four panels over context: predicted time, memory against the device's, waves,
and shared memory per block against the budget.

Drawn from the report's ``results`` (one :meth:`CaseResult.to_json` per traced case); decode
solid, prefill dashed, one line per batch size.
"""

from __future__ import annotations

from pathlib import Path

from attn_sim.report_text import shape_text

PANELS = (
    ("time_ms", "predicted time per step (ms)", "log"),
    ("memory_GB", "K+V + transient memory (GB)", "log"),
    ("max_waves", "waves of the largest launch", "log"),
    ("smem_max", "shared memory per block (bytes)", "linear"),
)


def _value(result: dict, key: str) -> float:
    if key == "time_ms":
        return result["time_s"] * 1e3
    if key == "memory_GB":
        return (result["kv_bytes"] + result["transient_bytes"]) / 1e9
    return result[key]


def _limit(ax, y: float, text: str) -> None:
    """A red horizontal line at ``y``, labelled at its left end."""
    ax.axhline(y, color="red", linewidth=1.5)
    ax.annotate(text, (0.02, y), xycoords=("axes fraction", "data"), color="red", va="bottom")


def plot(report: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig = figure(report)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure(report: dict):
    """The 2 x 2 matplotlib figure (Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    results = report["results"]
    for ax, (key, label, yscale) in zip(axes.flat, PANELS, strict=True):
        for path_name, style in (("decode", "-o"), ("prefill", "--s")):
            rows = [r for r in results if r["path"] == path_name]
            for batch in sorted({r["num_seqs"] for r in rows}):
                sel = sorted(
                    (r for r in rows if r["num_seqs"] == batch), key=lambda r: r["context"]
                )
                ax.plot(
                    [r["context"] for r in sel],
                    [_value(r, key) for r in sel],
                    style,
                    markersize=3,
                    label=f"{path_name} b{batch}",
                )
        ax.set_xscale("log", base=2)
        ax.set_yscale(yscale)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    ax_mem, ax_smem = axes.flat[1], axes.flat[3]
    memory_gb = report["memory_bytes"] / 1e9
    _limit(ax_mem, memory_gb, f"device memory {memory_gb:.1f} GB")
    budgets = sorted({r["smem_budget"] for r in results})
    for budget in budgets:
        _limit(ax_smem, budget, f"per-block budget {budget:,} B")
    ax_smem.set_ylim(0, 1.12 * max(budgets + [r["smem_max"] for r in results]))
    axes.flat[0].legend(fontsize=7, ncol=2)
    fig.suptitle(f"attn-core on simulated {report['profile']} ({shape_text(report['shape'])})")
    fig.tight_layout()
    return fig
