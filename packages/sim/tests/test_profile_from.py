"""``profile-from``: a device-facts file becomes a complete, checked profile (issue 12 item 2).

tests/data/device_facts_sample.json is an illustrative H200 file in the agreed format (driver
values as the h200 profile has them, invented bandwidth / rates / latencies, two fields and two
other facts absent, four decode-tier rows); it is not a measurement.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from _cli import DELETE, assert_bad_input, changed, run

from attn_core.device.profile_file import FIELDS, SCHEMA
from attn_core.device.spec import DEVICE_SPECS
from attn_sim import profile_from
from attn_sim.facts import PROFILE_FACTS, read_facts, tier_winners
from attn_sim.profiles import load_profile
from attn_sim.simulate import simulate
from attn_sim.workloads import Case

SAMPLE = Path(__file__).parent / "data" / "device_facts_sample.json"
H200 = DEVICE_SPECS["h200"]
FEW_CASES = [Case("decode", 64, 32768), Case("decode", 1, 1024)]


@pytest.fixture(autouse=True)
def few_cases(monkeypatch):
    """Two cases instead of the report's 37 (each traced on both profiles)."""
    monkeypatch.setattr(profile_from, "compare_cases", lambda: FEW_CASES)


def sample() -> dict:
    return json.loads(SAMPLE.read_text())


def write(tmp_path: Path, data: dict) -> str:
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_sample_becomes_a_complete_profile_with_provenance(tmp_path):
    out = tmp_path / "profiles" / "h200-local.json"
    r = run("profile-from", str(SAMPLE), "--base", "h200", "--out", str(out))
    assert r.code == 0, r.err
    data = json.loads(out.read_text())
    assert data["schema"] == SCHEMA and data["base"] == "h200"
    assert data["name"] == "h200+h200-local" and set(data["fields"]) == set(FIELDS)
    spec = load_profile(str(out))
    facts = sample()["facts"]
    for field in PROFILE_FACTS:
        fact = facts[field]
        if fact["value"] is None:  # absent: the base's value and provenance stay
            assert getattr(spec, field) == getattr(H200, field)
            assert spec.provenance[field] == H200.provenance[field]
        else:
            assert getattr(spec, field) == fact["value"]
            assert spec.provenance[field] == (
                f"measured on h200-local 2026-12-01 by device-facts: {fact['method']}"
            )
    assert spec.register_alloc_unit == H200.register_alloc_unit  # not a fact: from the base


def test_profile_is_usable_everywhere_a_profile_name_is(tmp_path):
    out = tmp_path / "p.json"
    assert run("profile-from", str(SAMPLE), "--base", "h200", "--out", str(out)).code == 0
    r = run("occupancy", "--profile", str(out), "--threads", "128")
    assert r.code == 0 and "h200+h200-local: 16 blocks/SM" in r.out
    spec = load_profile(str(out))
    slower = simulate(spec, FEW_CASES[0])  # 4.1 TB/s measured against the 4.8 datasheet
    assert slower.time_s > simulate(H200, FEW_CASES[0]).time_s


def test_printed_tables(tmp_path):
    r = run("profile-from", str(SAMPLE), "--base", "h200", "--out", str(tmp_path / "p.json"))
    assert "15 of 17 profile fields measured" in r.out
    assert "kept (absent: not measured in this run)" in r.out  # fp32_flops
    others = r.out.split("not profile fields")[1]
    for name in ("shared_mem_per_block_optin", "copy_bandwidth", "bf16_flops", "v2_probe"):
        assert name in others
    assert "absent: no vendor paged_attention_v1" in others
    moved = r.out.split("move by more than 10%")[1]
    assert "decode b64 ctx32768" in moved  # bandwidth-bound: +17 %
    assert "wrote" in r.out


def test_tier_winner_per_shape():
    rows = read_facts(SAMPLE).facts["decode_tiers"].value
    won = {w["shape"]: (w["winner"], w["by"]) for w in tier_winners(rows)}
    assert won == {
        "num_seqs=8, context=8192": ("one_pass", "graph"),
        "num_seqs=1, context=32768": ("partitioned", "graph"),
    }
    eager_only = [dict(r, graph_s=None) for r in rows[:2]]
    assert tier_winners(eager_only)[0]["by"] == "eager"


def test_only_moves_over_ten_percent_are_listed():
    spec, _ = profile_from.build(H200, read_facts(SAMPLE), "h200+x")
    rows = profile_from.moved_times(H200, spec)
    for case in FEW_CASES:
        old, new = simulate(H200, case), simulate(spec, case)
        moves = max(abs(new.time_s / old.time_s - 1), abs(new.graph_time_s / old.graph_time_s - 1))
        assert (case.label() in [r["case"] for r in rows]) == (moves > 0.10)
    assert rows  # the sample's bandwidth moves the 64 x 32K case by ~17 %
    assert profile_from.moved_times(H200, dataclasses.replace(H200, name="h200+same")) == []


def test_nothing_measured_warns(tmp_path):
    data = sample()
    for field in PROFILE_FACTS:
        data["facts"][field] = {"value": None, "unit": "", "absent": "quick run on a CPU"}
    r = run("profile-from", write(tmp_path, data), "--base", "h200", "--out", str(tmp_path / "p"))
    assert r.code == 0 and "warning: no profile field was measured" in r.out


def test_a_value_in_another_unit_is_warned_about_or_refused(tmp_path):
    data = sample()
    data["facts"]["hbm_bandwidth"]["value"] = 4.1e10  # possible, but 117x below the base's
    r = run("profile-from", write(tmp_path, data), "--base", "h200", "--out", str(tmp_path / "p"))
    assert r.code == 0 and "warning: hbm_bandwidth 4.1e+10" in r.out
    data["facts"]["hbm_bandwidth"]["value"] = 4100.0  # GB/s where bytes/s is the unit
    r = run("profile-from", write(tmp_path, data), "--base", "h200", "--out", str(tmp_path / "q"))
    assert r.code == 2 and "hbm_bandwidth must be within" in r.err and "bytes/s" in r.err
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        ("schema", "bi100-attn/device-facts/2", "schema"),
        ("target", DELETE, "target is missing"),
        ("target", "", "target"),
        ("date", "yesterday", "date"),
        ("quick", "no", "quick"),
        ("facts", [], "facts"),
        ("facts.sm_count", 132, "facts.sm_count"),
        ("facts.sm_count.value", DELETE, "facts.sm_count.value is missing"),
        ("facts.sm_count.value", None, "facts.sm_count.value is null"),
        ("facts.sm_count.value", 0, "facts.sm_count.value"),
        ("facts.sm_count.value", 1.5, "facts.sm_count.value"),
        ("facts.sm_count.value", "132", "facts.sm_count.value"),
        ("facts.sm_count.value", True, "facts.sm_count.value"),
        ("facts.sm_count.method", DELETE, "facts.sm_count.method"),
        ("facts.hbm_bandwidth.value", -5, "facts.hbm_bandwidth.value"),
        ("facts.hbm_bandwidth.value", float("nan"), "facts.hbm_bandwidth.value"),
        ("facts.launch_gap_s.value", -1e-6, "facts.launch_gap_s.value"),
        ("facts.fp32_flops.value", 1e13, "facts.fp32_flops.value"),  # value beside 'absent'
        ("facts.fp32_flops.absent", "", "facts.fp32_flops.absent"),
        ("facts.decode_tiers.value", "fast", "facts.decode_tiers.value"),
        ("facts.decode_tiers.value", [{"shape": "b1", "graph_s": 1e-4}], "tier is missing"),
        ("facts.decode_tiers.value", [{"shape": "b1", "tier": "x"}], "neither graph_s"),
        ("facts.decode_tiers.value", [{"shape": "b1", "tier": "x", "graph_s": -1}], "graph_s"),
    ],
)
def test_bad_facts_are_named(path, value, named, tmp_path):
    facts = write(tmp_path, changed(sample(), path, value))
    r = run("profile-from", facts, "--base", "h200", "--out", str(tmp_path / "p.json"))
    assert_bad_input(r, facts, named)
    assert not (tmp_path / "p.json").exists()  # nothing written for a bad file


def test_launch_latencies_may_be_zero(tmp_path):
    facts = write(tmp_path, changed(sample(), "facts.launch_gap_s.value", 0))
    r = run("profile-from", facts, "--base", "h200", "--out", str(tmp_path / "p.json"))
    assert r.code == 0 and load_profile(str(tmp_path / "p.json")).launch_gap_s == 0


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (("--name", "lab"), "--name"),
        (("--name", "bi-v100+lab"), "--name"),  # base is h200
        (("--name", "h200+"), "--name"),
        (("--base", "v100"), "--base"),
    ],
)
def test_bad_arguments(argv, named, tmp_path):
    r = run("profile-from", str(SAMPLE), "--base", "h200", *argv, "--out", str(tmp_path / "p"))
    assert_bad_input(r, named)


def test_default_name_needs_a_plain_target(tmp_path):
    facts = write(tmp_path, changed(sample(), "target", "lab/machine 1"))
    r = run("profile-from", facts, "--out", str(tmp_path / "p"))
    assert_bad_input(r, "default name")


def test_out_is_checked(tmp_path):
    r = run("profile-from", str(SAMPLE), "--out", str(tmp_path))
    assert_bad_input(r, "--out", "is a directory")
    assert_bad_input(run("profile-from", str(tmp_path / "none.json")), "does not exist")
