"""The long-context suite's hybrid kind: one Gated DeltaNet layer's chunked prefill of the
prompt, then one decode step from its final state, checked against float64 and timed. Quick on
the CPU here: the records, the checks' errors, and that the calibration file stays attention
only (attn_sim calibrate reads it)."""

from __future__ import annotations

import json
import sys

import torch
from hil_helpers import REPO

sys.path.insert(0, str(REPO / "hil" / "suites"))

import long_context  # noqa: E402
import long_context_hybrid as hybrid  # noqa: E402
import suite_vars  # noqa: E402
from hybrid_layer import LinearLayerShape, layer_inputs  # noqa: E402


def run_quick_hybrid(tmp_path, *extra: str) -> tuple:
    rc = long_context.main(["--out", str(tmp_path), "--quick", "--device", "cpu", "--kinds",
                            "hybrid", "--repeats", "1", "--warmup", "0",
                            "--junit", str(tmp_path / "j.xml"), *extra])  # fmt: skip
    records = json.loads((tmp_path / "long_context_all.json").read_text())["records"]
    return rc, records


def test_hybrid_is_a_kind_run_by_default():
    assert "hybrid" in suite_vars.KINDS
    args = long_context.parse_args([])
    long_context.resolve(args, environ={})
    assert args.kinds == list(suite_vars.KINDS)


def test_the_float64_recurrence_is_the_reference_rule():
    """The device-side float64 recurrence the long cases are checked against gives what
    attn_core.reference.reference_gated_delta gives, segment boundaries included."""
    from attn_core.reference import reference_gated_delta

    x = layer_inputs(1, 37, LinearLayerShape(2, 4, 16, 8), torch.float32, "cpu", seed=3)
    want_out, want_state = reference_gated_delta(x.q, x.k, x.v, x.g, x.beta, use_qk_l2norm=True)
    parts = list(hybrid.float64_recurrence(x, segment=10))
    assert [start for start, _, _ in parts] == [0, 10, 20, 30]
    got_out = torch.cat([out for _, out, _ in parts])
    torch.testing.assert_close(got_out, want_out[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(parts[-1][2], want_state[0], rtol=1e-12, atol=1e-12)


def test_quick_hybrid_on_the_cpu_records_time_memory_and_small_errors(tmp_path):
    rc, records = run_quick_hybrid(tmp_path)
    assert rc == 0
    assert [(r["kind"], r["context_len"]) for r in records] == [
        ("hybrid", c) for c in long_context.QUICK_CONTEXTS
    ]
    shape = hybrid.QUICK_LAYER
    for r in records:
        assert (r["backend"], r["decode_backend"]) == ("torch", "torch")
        assert r["backend_detail"] == "needs a CUDA device, got cpu"
        assert (r["num_heads"], r["num_value_heads"], r["head_size"], r["head_v"]) == (
            shape.num_heads, shape.num_value_heads, shape.head_k, shape.head_v)  # fmt: skip
        assert r["dtype"] == "float32" and r["device"] == "cpu" and r["query_len"] == 1
        assert r["median_s"] > 0 and r["prefill_s"] > 0 and r["decode_s"] > 0
        assert r["peak_bytes"] is None  # not tracked for CPU tensors
        assert r["reference_prefix"] == min(r["context_len"], hybrid.QUICK_PREFIX)
        for part in ("prefix", "prompt", "decode", "state"):
            assert 0 <= r[f"{part}_rel_error"] < 1e-5, (part, r)
        assert r["rel_error"] <= r["tolerance"] == long_context.TOLERANCE["float32"]
    metrics = json.loads((tmp_path / "long_context_metrics.json").read_text())
    assert metrics == []  # attn_sim calibrate's input: attention steps only
    junit = (tmp_path / "j.xml").read_text()
    assert junit.count("<testcase") == 2 and "<failure" not in junit and "hybrid[torch]" in junit
    assert "hybrid" in (tmp_path / "long_context_table.md").read_text()


def test_a_decode_step_that_corrupts_the_state_fails_the_case(tmp_path, monkeypatch):
    import attn_core

    real = attn_core.gated_delta_decode

    def drifting(*args, **kwargs):
        out = real(*args, **kwargs)
        args[5].add_(0.01)  # the state pool: a step that writes a wrong state
        return out

    monkeypatch.setattr(attn_core, "gated_delta_decode", drifting)
    rc, records = run_quick_hybrid(tmp_path, "--contexts", "100")
    assert rc == 1
    assert records[0]["state_rel_error"] > records[0]["tolerance"]
    assert "<failure" in (tmp_path / "j.xml").read_text()
