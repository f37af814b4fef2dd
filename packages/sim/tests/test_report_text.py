"""The report a first reader gets (issue 11, "Simulator report").

Decode 64 x 100K needs 55 GB of transient memory on a 32 GiB device and was shown as fitting;
the prefill table called its backend a "tier" and its key tile "partitions"; nothing said why
``launches`` differs from ``plan_launches`` or why the design table's 0.75 ms is not the traced
3.9 ms; the plot had no waves or shared-memory panel.
"""

from __future__ import annotations

import matplotlib.colors
import pytest

from attn_sim import report, report_plot, report_text
from attn_sim.profiles import load_profile
from attn_sim.simulate import simulate
from attn_sim.workloads import Case

BI = load_profile("bi-v100")


@pytest.fixture(scope="module")
def built():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(report, "DECODE_CONTEXTS", (1024, 102400))
        mp.setattr(report, "DECODE_BATCHES", (1, 64))
        mp.setattr(report, "PREFILL_CASES", [(1, 32768)])
        mp.setattr(report, "DESIGN_CONTEXTS", (102400,))
        yield report.build(BI)


def test_step_over_device_memory_is_flagged(built):
    row = {(r["batch"], r["context"]): r for r in built["decode"]}
    big, small = row[(64, 102400)], row[(1, 1024)]
    assert big["cache_fits_device"]  # K+V alone (26.8 GB) fits 32 GiB ...
    assert not big["step_fits_device"]  # ... K+V + transient does not
    assert big["kv+transient_GB"] > BI.memory_bytes / 1e9
    assert big["device_memory"].startswith("OVER")
    assert small["step_fits_device"] and small["device_memory"] == "ok"
    assert built["over_device_memory"] == ["decode b64 ctx102400"]
    md = report_text.markdown(built)
    assert "**1 decode cases need more than the device's 34.4 GB (32 GiB)**" in md
    assert "b64 x 102,400" in md


def test_report_numbers_are_the_simulated_ones(built):
    r = simulate(BI, Case("decode", 64, 102400))
    row = next(x for x in built["decode"] if (x["batch"], x["context"]) == (64, 102400))
    assert row["time_ms"] == round(r.time_s * 1e3, 3)
    assert row["transient_MB"] == round(r.transient_bytes / 1e6, 1)


def test_prefill_table_has_its_own_columns(built):
    (row,) = built["prefill"]
    assert "tier" not in row and "partitions" not in row
    assert row["backend"] == "torch" and row["new_tokens"] == report.PREFILL_CHUNK
    assert row["key_tile"] > 0 and row["query_tile"] > 0 and row["stream_chunk"] >= 0
    assert row["tile_updates"] >= 1 and row["plan_steps"] >= 1
    assert "`backend`" in report_text.markdown(built)


def test_legends_explain_launches_and_analytic_time(built):
    md = report_text.markdown(built)
    assert "`plan_launches`: launches a purpose-built kernel" in md
    assert "`time_us` is *analytic*" in md
    plan = [d for d in built["designs"] if d["family"].startswith("attn-core plan")]
    analytic_ms = sum(d["time_us"] for d in plan) / 1e3
    traced = next(r for r in built["decode"] if (r["batch"], r["context"]) == (1, 102400))
    sentence = report_text.design_vs_traced(built)
    assert sentence.startswith("At 102,400 tokens, batch 1")
    assert f"take {analytic_ms:.3g} ms" in sentence
    assert f"{traced['graph_ms']:.3g} ms replayed" in sentence
    assert analytic_ms < traced["graph_ms"]  # the torch code is slower than its own design


def _panels(fig):
    return {ax.get_title(): ax for ax in fig.axes if ax.get_visible() and ax.has_data()}


def test_plot_has_time_memory_waves_and_shared_memory_panels(built):
    """A title on every panel; memory per layer in GiB; the red limit lines at the device's
    memory and the per-block budget, and no data line in their colour."""
    fig = report_plot.figure(built)
    panels = _panels(fig)
    assert list(panels) == [title for title, *_ in report_plot.PANELS]
    assert all(title for title in panels)
    mem_ax = panels[report_plot.MEMORY_TITLE]
    assert "GiB" in mem_ax.get_ylabel() and "per layer" in mem_ax.get_ylabel()
    limits = [ln.get_ydata()[0] for ln in mem_ax.lines if ln.get_color() == report_plot.LIMIT]
    assert limits == [pytest.approx(BI.memory_bytes / 2**30)]
    smem_ax = panels[report_plot.SMEM_TITLE]
    budgets = [ln.get_ydata()[0] for ln in smem_ax.lines if ln.get_color() == report_plot.LIMIT]
    assert budgets == [BI.shared_mem_per_block]
    for ax in panels.values():
        data = [ln for ln in ax.lines if list(ln.get_xdata()) != [0, 1]]  # not an axhline
        colours = {matplotlib.colors.to_hex(ln.get_color()) for ln in data}
        assert not colours & {matplotlib.colors.to_hex(report_plot.LIMIT), "#d62728"}, ax
        ticks = [t.get_text() for t in ax.get_xticklabels()]
        assert {"32K", "100K", "256K"} <= set(ticks), ticks
    waves_ax = panels[report_plot.WAVES_TITLE]
    plotted = {max(ln.get_ydata()) for ln in waves_ax.lines}
    assert max(r["max_waves"] for r in built["results"]) in plotted


def test_plot_never_mixes_graph_and_eager_in_one_panel(built):
    """Issue 18: the time panels draw what runs (native and torch decode, graph-replayed;
    prefill eager, apart), every panel has a legend, cases beyond device memory are drawn
    apart."""
    fig = report_plot.figure(built)
    panels = _panels(fig)
    for title, ax in panels.items():
        names = " ".join(ln.get_label() for ln in ax.lines)
        assert not ("graph" in names and "eager" in names), (title, names)
    decode = panels[report_plot.DECODE_TIME_TITLE]
    names = [ln.get_label() for ln in decode.lines]
    native = [r for r in built["native"] if "native_ms" in r]
    assert native and any("native" in n for n in names) and any("torch" in n for n in names)
    native_line = next(ln for ln in decode.lines if ln.get_label().startswith("decode native"))
    assert set(native_line.get_ydata()) <= {r["native_ms"] for r in native}
    assert "eager" in " ".join(
        ln.get_label() for ln in panels[report_plot.PREFILL_TIME_TITLE].lines
    )
    assert all(ax.get_legend() is not None for ax in panels.values())
    mem_ax = panels[report_plot.MEMORY_TITLE]
    assert built["over_device_memory"]  # the fixture has a case beyond memory ...
    crosses = [c for c in mem_ax.collections if c.get_label() == "beyond device memory"]
    assert crosses and len(crosses[0].get_offsets()) >= 1  # ... drawn apart
    assert "native" in fig._suptitle.get_text()


def test_coreX_caveat_comes_first_in_one_sentence(built):
    md = report_text.markdown(built).splitlines()
    assert md[2] == report_text.COREX_CAVEAT
    assert len(report_text.COREX_CAVEAT) < 100 and report_text.COREX_CAVEAT.count(". ") == 0
    from attn_sim.native_design import NATIVE_LEGEND

    assert "until the lab records CoreX" not in NATIVE_LEGEND


def test_terminal_summary_starts_with_the_caveat_and_ends_with_a_verdict(built, tmp_path):
    from attn_sim import cli
    from attn_sim.gates import GateReport

    text = report_text.markdown(built)
    passed = GateReport(checks=12)
    lines = cli.report_summary(built, text, tmp_path, passed, full=False).splitlines()
    assert lines[0] == report_text.COREX_CAVEAT
    assert lines[-1].startswith("verdict: gates passed") and "next:" in lines[-1]
    failed = GateReport(checks=12)
    failed.violations.append(object())
    last = cli.report_summary(built, text, tmp_path, failed, full=False).splitlines()[-1]
    assert last.startswith("verdict: gates FAILED") and "gates" in last


def test_hybrid_request_table_splits_full_and_linear_layers(built):
    rows = built["hybrid_request"]
    assert {(r["profile"], r["path"]) for r in rows} >= {
        ("bi-v100", "native"),
        ("h200", "fallback"),
    }
    assert {r["prompt"] for r in rows} == {"32K", "128K", "256K"}
    text = report_text.markdown(built)
    assert "## Attention time of one request (hybrid model" in text
    assert "10 full + 30 linear" in text and "tests/test_linear_layer.py" in text
    assert "FALLBACK_LAUNCHES_PER_CHUNK" in text  # every constant with its provenance
