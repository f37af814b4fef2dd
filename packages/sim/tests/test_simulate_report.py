"""attn-core's real decode/prefill traced end to end; the report's files and numbers."""

from __future__ import annotations

import json
import resource

import pytest

from attn_sim import report
from attn_sim.cli import main
from attn_sim.profiles import load_profile
from attn_sim.simulate import simulate
from attn_sim.workloads import Case

BI = load_profile("bi-v100")


def _rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def test_one_million_token_decode_traces_without_real_memory():
    before = _rss_bytes()
    r = simulate(BI, Case("decode", 1, 1 << 20))
    assert r.kv_bytes == 2 * (1 << 20) * 4 * 256 * 2  # 4 GiB of K+V, never allocated
    assert _rss_bytes() - before < 512 * 1024 * 1024
    assert r.syncs == 0 and r.launches > 0 and r.tier == "partitioned"
    assert r.bytes >= r.kv_bytes  # the step reads at least the context's K and V
    assert r.workspace_bytes > 0 and r.transient_bytes > r.workspace_bytes


def test_decode_bytes_and_flops_are_at_least_the_attention_floor():
    r = simulate(BI, Case("decode", 2, 4096))
    attention_flops = 4 * 2 * 24 * 4096 * 256  # q.k and p.v over every query head
    assert r.flops >= attention_flops
    assert r.bytes >= r.kv_bytes


def test_prefill_traces():
    r = simulate(BI, Case("prefill", 1, 4096, query_len=512))
    assert r.launches > 0 and r.time_s > 0 and r.plan_fits


def test_bad_path_is_named():
    with pytest.raises(ValueError, match="path"):
        simulate(BI, Case("encode", 1, 16))


def test_report_writes_tables_plot_and_json(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "DECODE_CONTEXTS", (1024, 102400))
    monkeypatch.setattr(report, "DECODE_BATCHES", (1, 8))
    monkeypatch.setattr(report, "PREFILL_CASES", [(1, 4096)])
    monkeypatch.setattr(report, "DESIGN_CONTEXTS", (8192, 102400))
    assert main(["report", "--profile", "bi-v100", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "report.json").read_text())
    assert (tmp_path / "report.png").stat().st_size > 10_000
    md = (tmp_path / "report.md").read_text()
    assert "16 SMs, 32 KiB shared memory per block" in md
    v1 = {(d["context"], d["kernel"]): d for d in data["designs"]}
    assert not v1[(8192, "vllm_v1")]["fits"]  # logits of 8K tokens overflow 32 KiB
    assert v1[(102400, "vllm_v2_partition")]["blocks"] == 4800
    assert v1[(102400, "gqa_partition")]["blocks"] == 800
    budget = {b["design"]: b["longest_fitting_context"] for b in data["budget"]}
    assert budget["vllm_v1"] == 8048  # 8048 * 4 + 528 static bytes <= 32768
    assert len(data["decode"]) == 4 and len(data["prefill"]) == 1


def test_report_shape_option_parses_and_refuses_bad_shapes():
    assert report.parse_shape("32,8,128") == report.AttentionShape(32, 8, 128)
    assert report.parse_shape("16,2,256,32").block_size == 32
    with pytest.raises(ValueError, match="kv_heads"):
        report.parse_shape("24,5,256")
