"""device-facts suite: the CPU quick run's file is well formed and profile-from takes it; the
pieces that need a GPU are checked here with fakes (driver answers, V1 probes) or on the CPU
(the tier forcing), so what the lab runs has been through its logic before it gets there."""

from __future__ import annotations

import json
import os
import sys
import time
import types
from pathlib import Path

import pytest
import torch
from hil_helpers import REPO

SUITES = REPO / "hil" / "suites"
sys.path.insert(0, str(SUITES))  # the suite's modules import each other as siblings

import device_facts  # noqa: E402
import device_facts_driver as driver  # noqa: E402
import device_facts_tiers as tiers  # noqa: E402
import device_facts_v1 as v1  # noqa: E402

from attn_sim.facts import PROFILE_FACTS, read_facts  # noqa: E402

CPU_WHY = "no CUDA device on this run"


def run_cpu_quick(out: Path) -> tuple:
    rc = device_facts.main(
        ["--out", str(out), "--quick", "--device", "cpu", "--target", "ci-cpu",
         "--junit", str(out / "device-facts.xml")]
    )  # fmt: skip
    return rc, json.loads((out / device_facts.FACTS_FILE).read_text())


def test_cpu_quick_run_writes_a_well_formed_file_with_every_gpu_fact_absent(tmp_path):
    rc, doc = run_cpu_quick(tmp_path)
    assert rc == 0
    facts = read_facts(tmp_path / device_facts.FACTS_FILE)  # the simulator's own checks
    assert facts.target == "ci-cpu" and facts.quick and facts.device_name == "cpu"
    assert doc["schema"] == "bi100-attn/device-facts/1"
    assert set(PROFILE_FACTS) <= set(facts.facts)  # each profile field says why it is absent
    expected = {n for s in device_facts.SECTIONS for n in device_facts.section_names(s)}
    assert set(facts.facts) == expected
    for name, fact in facts.facts.items():
        assert not fact.measured and CPU_WHY in fact.absent, name
        assert doc["facts"][name]["value"] is None
    assert doc["sizes"] == json.loads(
        json.dumps(device_facts.dataclasses.asdict(device_facts.QUICK))
    )
    junit = (tmp_path / "device-facts.xml").read_text()
    assert junit.count("<skipped") == len(device_facts.SECTIONS)


def test_profile_from_accepts_the_cpu_facts_and_keeps_the_base(tmp_path, monkeypatch, capsys):
    from attn_core.device.spec import DEVICE_SPECS
    from attn_sim import profile_from
    from attn_sim.cli import main as sim_main
    from attn_sim.profiles import load_profile

    run_cpu_quick(tmp_path)
    # the tables, not the 37 traced cases on two profiles (a minute on a loaded CI machine)
    monkeypatch.setattr(profile_from, "compare_cases", lambda: [])
    out = tmp_path / "profile.json"
    rc = sim_main(["profile-from", str(tmp_path / device_facts.FACTS_FILE), "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert "0 of 17 profile fields measured" in printed
    spec, base = load_profile(str(out)), DEVICE_SPECS["bi-v100"]
    assert spec.name == "bi-v100+ci-cpu"
    for field in PROFILE_FACTS:  # absent facts fall back to the base, value and provenance
        assert getattr(spec, field) == getattr(base, field)
        assert spec.provenance[field] == base.provenance[field]


def test_registered_suite_runs_with_the_local_executor(make_ctx):
    from hil.config import Target, load_config
    from hil.runner import run_all
    from hil.status import Status

    config = load_config(REPO / "hil/targets.toml", REPO / "hil/suites/suites.toml", environ={})
    ctx = make_ctx("local", quick=True)
    result = run_all([Target("local")], [config.suites["device-facts"]], ctx)[0]
    assert result.status == Status.PASS, result.detail
    facts = read_facts(Path(result.artifacts) / device_facts.FACTS_FILE)
    assert facts.quick and facts.target == "local"
    assert all(not f.measured for f in facts.facts.values())


def test_sections_argument_names_the_bad_value(capsys):
    with pytest.raises(SystemExit):
        device_facts.parse_args(["--sections", "driver,bogus"])
    assert (
        "--sections must name some of driver, rates, tiers, prefill, linear, v1"
        in capsys.readouterr().err
    )


def test_v1_stays_last_and_linear_comes_before_it():
    """v1's probes may wedge the device: every other section, linear included, runs first."""
    assert device_facts.SECTIONS[-1] == "v1"
    assert device_facts.SECTIONS.index("linear") < device_facts.SECTIONS.index("v1")
    assert set(device_facts.RUNNERS) == set(device_facts.SECTIONS)


def test_a_section_that_raises_fails_the_suite_but_its_facts_say_why(tmp_path, monkeypatch):
    fake_cuda(monkeypatch)

    def boom(sizes, notes):
        raise RuntimeError("device fell over")

    monkeypatch.setitem(device_facts.RUNNERS, "rates", boom)
    rc = device_facts.main(["--out", str(tmp_path), "--quick", "--device", "cuda",
                            "--sections", "rates"])  # fmt: skip
    assert rc == 1
    facts = read_facts(tmp_path / device_facts.FACTS_FILE)
    assert "rates section raised RuntimeError: device fell over" in facts.facts["fp16_flops"].absent


def fake_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")


def test_the_file_is_written_after_each_section(tmp_path, monkeypatch):
    fake_cuda(monkeypatch)
    seen = {}

    def driver_section(sizes, notes):
        return {"sm_count": {"value": 16, "unit": "SMs", "method": "fake"}}

    def tiers_section(sizes, notes):  # what a watchdog kill here would leave behind
        seen.update(json.loads((tmp_path / device_facts.FACTS_FILE).read_text())["facts"])
        return {}

    monkeypatch.setitem(device_facts.RUNNERS, "driver", driver_section)
    monkeypatch.setitem(device_facts.RUNNERS, "tiers", tiers_section)
    args = ["--out", str(tmp_path), "--device", "cuda", "--sections", "driver,tiers"]
    assert device_facts.main(args) == 0
    assert seen == {"sm_count": {"value": 16, "unit": "SMs", "method": "fake"}}
    assert not list(tmp_path.glob("*.tmp"))


def fake_v1(monkeypatch, reach: dict):
    monkeypatch.setattr(device_facts.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(v1, "v1_reach", lambda guess, cap, timeout: reach)
    monkeypatch.setattr(device_facts, "v1_guess", lambda: 8048)


def test_v1_section_records_the_reach_the_first_failure_and_v2(monkeypatch):
    probes = [
        {"context": 16, "outcome": "ok", "detail": "relative error 1e-4"},
        {"context": 8048, "outcome": "ok", "detail": "relative error 1e-4"},
        {"context": 8064, "outcome": "wrong", "detail": "output not finite (not written?)"},
    ]
    fake_v1(monkeypatch, {"reach": 8048, "first_failure": 8064, "stopped": None, "probes": probes})
    monkeypatch.setattr(
        v1, "run_probe", lambda args, t: {"outcome": "refused", "detail": "NotImplementedError"}
    )
    facts = device_facts.run_v1(device_facts.QUICK, {})
    reach = facts["native_v1_max_seq_len"]
    assert reach["value"] == 8048 and reach["unit"] == "tokens"
    assert "(8048)" in reach["method"] and "8064 wrong: output not finite" in reach["method"]
    assert facts["native_v1_probes"]["value"] == probes
    assert facts["v2_probe"]["value"] == {
        "available": False,
        "error": "refused: NotImplementedError",
    }


def test_v1_hang_is_recorded_and_v2_is_not_probed(monkeypatch):
    probes = [
        {"context": 16, "outcome": "ok", "detail": "fine"},
        {"context": 8048, "outcome": "hang", "detail": "no answer in 60 s (HANG; killed)"},
    ]
    fake_v1(monkeypatch, {"reach": 16, "first_failure": None, "stopped": "hang", "probes": probes})

    def no_probe(*a):
        raise AssertionError("V2 must not be probed after a V1 hang")

    monkeypatch.setattr(v1, "run_probe", no_probe)
    facts = device_facts.run_v1(device_facts.QUICK, {})
    assert "HANG at context 8048" in facts["native_v1_max_seq_len"]["method"]
    assert "hung" in facts["v2_probe"]["absent"]


def test_v1_absent_op_is_absent_with_the_probes_reason(monkeypatch):
    probes = [{"context": 16, "outcome": "absent", "detail": "torch.ops._C.paged_attention_v1 "
               "is not registered"}]  # fmt: skip
    fake_v1(
        monkeypatch, {"reach": None, "first_failure": None, "stopped": "absent", "probes": probes}
    )
    monkeypatch.setattr(v1, "run_probe", lambda args, t: probes[0])
    facts = device_facts.run_v1(device_facts.QUICK, {})
    assert "is not registered" in facts["native_v1_max_seq_len"]["absent"]
    assert "is not registered" in facts["v2_probe"]["absent"]


# ---------------------------------------------------------------- driver facts (faked)
class FakeRuntime:
    label = "cudaDeviceGetAttribute via ctypes (fake)"

    def __init__(self, answers):
        self.answers = answers

    def get(self, attr):
        return self.answers.get(attr)


def test_driver_prefers_torch_checks_it_against_the_runtime_and_fills_the_gaps(monkeypatch):
    # torch 2.1's properties: no warp size, registers or shared memory
    props = types.SimpleNamespace(
        multi_processor_count=16,
        max_threads_per_multi_processor=4096,
        L2_cache_size=4 << 20,
        total_memory=32 << 30,
        major=7,
        minor=0,
    )
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: props)
    answers = {16: 16, 10: 64, 8: 32768, 97: 49152, 81: 131072, 39: 2048}  # 39 disagrees
    monkeypatch.setattr(driver, "find_runtime", lambda d: (FakeRuntime(answers), ""))
    facts, label = driver.driver_facts(0)
    assert label == FakeRuntime.label
    assert facts["sm_count"]["value"] == 16
    assert (
        "multi_processor_count (cudaDevAttrMultiProcessorCount agrees)"
        in facts["sm_count"]["method"]
    )
    assert facts["max_threads_per_sm"]["value"] == 4096
    assert "says 2048" in facts["max_threads_per_sm"]["method"]
    method = f"cudaDevAttrWarpSize: {FakeRuntime.label}"
    assert facts["warp_size"] == {"value": 64, "unit": "threads", "method": method}
    assert facts["shared_mem_per_block"]["value"] == 32768
    assert facts["shared_mem_per_block_optin"]["value"] == 49152
    assert facts["memory_bytes"]["value"] == 32 << 30
    assert "gave an error" in facts["registers_per_sm"]["absent"]  # runtime had no answer
    assert facts["max_registers_per_thread"]["absent"] == driver.NO_REGS_PER_THREAD


def test_driver_without_any_runtime_says_why(monkeypatch):
    props = types.SimpleNamespace(multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: props)
    monkeypatch.setattr(driver, "find_runtime", lambda d: (None, "no libcudart found"))
    facts, label = driver.driver_facts(0)
    assert label == "none: no libcudart found"
    assert facts["sm_count"]["value"] == 132
    why = facts["max_blocks_per_sm"]["absent"]
    assert "no CUDA runtime to ask (no libcudart found)" in why
    assert (
        "torch" in facts["warp_size"]["absent"]
        and "no property warp_size" in facts["warp_size"]["absent"]
    )


def test_cudart_candidates_are_existing_names_without_duplicates():
    found = driver.cudart_candidates()
    assert len(found) == len(set(found))
    assert all("cudart" in os.path.basename(p) for p in found)


# ---------------------------------------------------------------- V1 reach (faked probes)
def fake_probe(limit: int, hang_at=None, absent=False):
    seen = []

    def probe(n):
        seen.append(n)
        if absent:
            return {
                "outcome": "absent",
                "detail": "torch.ops._C.paged_attention_v1 is not registered",
            }
        if hang_at is not None and n >= hang_at:
            return {"outcome": "hang", "detail": "no answer"}
        if n <= limit:
            return {"outcome": "ok", "detail": "relative error 1e-4"}
        return {"outcome": "refused", "detail": "RuntimeError: too much shared memory"}

    return probe, seen


@pytest.mark.parametrize("limit", [16, 4000, 8048, 8064, 12144, 100000])
def test_bisection_finds_the_exact_reach(limit):
    probe, seen = fake_probe(limit)
    r = v1.v1_reach(8048, 262144, 1.0, probe)
    assert (r["reach"], r["first_failure"], r["stopped"]) == (limit, limit + 16, None)
    assert len(seen) == len(set(seen)) <= 20
    assert all(n % 16 == 0 for n in seen)


def test_guess_right_costs_three_probes():
    probe, seen = fake_probe(8048)
    v1.v1_reach(8048, 262144, 1.0, probe)
    assert seen == [16, 8048, 8064]


def test_refused_at_one_block_is_reach_zero_and_cap_is_reported():
    probe, _ = fake_probe(0)
    assert v1.v1_reach(8048, 262144, 1.0, probe)["reach"] == 0
    probe, _ = fake_probe(10**9)
    r = v1.v1_reach(8048, 65536, 1.0, probe)
    assert r["reach"] == 65536 and "cap" in r["stopped"]


def test_hang_stops_the_bisection_with_what_was_known():
    probe, seen = fake_probe(12144, hang_at=16096)
    r = v1.v1_reach(8048, 262144, 1.0, probe)
    assert r["stopped"] == "hang" and r["reach"] == 8064 and seen[-1] == 16128  # doubled from 8064
    assert r["probes"][-1]["outcome"] == "hang"


def test_absent_op_stops_at_the_first_probe():
    probe, seen = fake_probe(0, absent=True)
    r = v1.v1_reach(8048, 262144, 1.0, probe)
    assert (r["reach"], r["stopped"], seen) == (None, "absent", [16])


def test_probe_subprocess_timeout_is_a_hang_and_kills_it(tmp_path):
    sleeper = tmp_path / "python"
    sleeper.write_text("#!/bin/sh\nsleep 30\n")
    sleeper.chmod(0o755)
    t0 = time.monotonic()
    answer = v1.run_probe(["v1", 16], 1.0, python=str(sleeper))
    assert answer["outcome"] == "hang" and "HANG" in answer["detail"]
    assert time.monotonic() - t0 < 10


def test_probe_subprocess_without_an_answer_is_a_crash():
    answer = v1.run_probe(["bogus"], 60.0)
    assert answer["outcome"] == "crash" and "exit 2" in answer["detail"]


def test_v1_probe_without_vllm_reports_absent():
    pytest.importorskip("engine_patch")
    if __import__("importlib").util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: the probe would run")
    answer = v1.run_probe(["v2"], 120.0)
    assert answer["outcome"] == "absent" and "vllm" in answer["detail"]


# ---------------------------------------------------------------- decode tiers on the CPU
def test_forced_tier_is_the_tier_planned_and_timed_through_plans_not_the_environment():
    before = dict(os.environ)
    cpu = torch.device("cpu")
    # the cache pool is fp16; the CPU torch path plans its matmuls in fp32 where it must
    rows = tiers.measure_tiers((1, 2), (48, 4000), 2, cpu, native=None)
    assert dict(os.environ) == before  # nothing steered through the environment
    assert [(r["shape"]["num_seqs"], r["shape"]["context"], r["tier"]) for r in rows] == [
        (b, c, t) for b in (1, 2) for c in (48, 4000) for t in tiers.TIERS
    ]
    for r in rows:
        assert "planned_tier" not in r, r  # the override took
        assert r["eager_s"] > 0 and r["graph_s"] is None and r["graph_error"]
        assert r["plan_picks"] in ("single_tile", "one_pass", "partitioned")
        if r["tier"] == "one_pass":
            assert r["num_partitions"] == 1
    long_partitioned = [
        r for r in rows if r["tier"] == "partitioned" and r["shape"]["context"] == 4000
    ]
    assert all(r["num_partitions"] > 1 for r in long_partitioned)
    # rows are what attn_sim.facts accepts as decode_tiers
    from attn_sim.facts import parse_facts

    doc = {"schema": "bi100-attn/device-facts/1", "target": "t", "date": "2026-12-01T00:00:00Z",
           "device_name": "cpu", "torch": "x", "quick": True,
           "facts": {"decode_tiers": {"value": rows, "unit": "s", "method": "m"}}}  # fmt: skip
    assert len(parse_facts(doc).facts["decode_tiers"].value) == len(rows)


# ---------------------------------------------------------------- in a container (docker)
@pytest.mark.docker
def test_device_facts_quick_in_a_cpu_container(engine, wheels_dir, make_ctx):
    import dataclasses

    from hil.config import load_config
    from hil.runner import run_all
    from hil.status import Status

    client, host = engine
    env = {"DOCKER_HOST": host, "HIL_WHEELS": str(wheels_dir)}
    config = load_config(REPO / "hil/targets.toml", REPO / "hil/suites/suites.toml", environ=env)
    target = dataclasses.replace(
        config.targets["cpu-local"],
        build_args={"STATUS_CHECK": os.environ.get("HIL_TEST_STATUS_CHECK", "1")},
    )
    ctx = make_ctx(quick=True)
    result = run_all([target], [config.suites["device-facts"]], ctx)[0]
    assert result.status == Status.PASS, result.detail
    facts = read_facts(Path(result.artifacts) / device_facts.FACTS_FILE)
    assert facts.target == "cpu-local" and facts.quick and facts.device_name == "cpu"
    assert all(CPU_WHY in f.absent for f in facts.facts.values())


def test_prefill_section_reports_each_variant_and_why(monkeypatch):
    """A variant that does not build, one that does not verify and one that raises are rows
    saying so (no GPU: the loader and the check are fakes; the timing is not reached)."""
    import device_facts_prefill as prefill

    from attn_core.core import verify_once
    from attn_core.native import loader
    from attn_core.native import prefill as native_prefill

    kind = native_prefill.PrefillLibrary.VERIFY_KIND

    class Lib:
        VERIFY_KIND = kind
        verify_config = native_prefill.PrefillLibrary.verify_config

        def __init__(self, mma):
            self.path = Path(f"/fake/libattn_prefill_{mma}.so")

    def load(cls, mma, settings, device):
        if mma == "corex_wmma":
            return None, loader.NativeStatus(False, "no CoreX toolkit")
        if mma == "fma":
            raise OSError("bad ELF")
        return Lib(mma), loader.NativeStatus(True, "cached build", str(Lib(mma).path))

    monkeypatch.setattr(loader, "load_library", load)
    verify_once.register(kind, lambda d, c, s: verify_once.Verdict(False, "3e-1"))
    verify_once.forget(kind)
    try:
        facts = prefill.prefill_facts(4, 8, 1, torch.device("cpu"))
    finally:
        verify_once.forget(kind)
        verify_once.register(kind, native_prefill._check)
    rows = facts["native_prefill"]["value"]
    library = "cached build: /fake/libattn_prefill_wmma.so"
    assert rows["wmma"] == {"builds": True, "library": library, "verified": False,
                            "detail": "3e-1"}  # fmt: skip
    assert rows["corex_wmma"] == {"builds": False, "library": "no CoreX toolkit"}
    assert rows["fma"] == {"builds": False, "library": "raised OSError: bad ELF"}
    assert "verify against the float64 reference" in facts["native_prefill"]["method"]


def test_tiers_section_records_the_native_kernels_beside_their_facts(monkeypatch):
    """native_kernels: the library's kernels as the driver reports them beside the record a
    BI-V100's plans read (CoreX's stand-in), the ones that differ marked; absent, saying why,
    without a library (no GPU: the library is a fake answering from the records)."""
    import attn_core
    from attn_core.device.spec import get_device_spec
    from attn_core.native import facts
    from attn_core.native.abi import KernelFacts

    bi = get_device_spec("bi-v100")

    class CoreXBuild:  # the stand-in's numbers, 8 more registers in the partition kernels
        def kernel_info(self, which, query_kind, cache_kind, bucket, group):
            q = facts.KINDS[query_kind]
            r = facts.lookup(which, q, q, bucket, 6, toolchain="corex")
            return KernelFacts(r.registers + 8 * (which == "partition"), r.smem_bytes, 0, 128, 2)

    monkeypatch.setattr(attn_core, "detect_device_spec", lambda device: bi)
    monkeypatch.setattr(tiers, "measure_tiers", lambda *args: [])
    monkeypatch.setattr(tiers, "native_library", lambda device: (CoreXBuild(), "fake, verified"))
    got = device_facts.run_tiers(device_facts.QUICK, {})
    rows = got["native_kernels"]["value"]
    assert len(rows) == 18 and set(device_facts.section_names("tiers")) == set(got)
    partition = next(r for r in rows if (r["kernel"], r["head bucket"], r["dtype"])
                     == ("partition", 256, "fp16"))  # fmt: skip
    record = facts.lookup("partition", "float16", "float16", 256, 6, toolchain="corex")
    assert partition["registers"] == record.registers + 8
    assert partition["recorded registers / smem"].endswith("(differs)")
    assert not any(r["recorded registers / smem"].endswith("(differs)")
                   for r in rows if r["kernel"] == "merge")  # fmt: skip
    monkeypatch.setattr(tiers, "native_library", lambda device: (None, "not built: no CoreX"))
    got = device_facts.run_tiers(device_facts.QUICK, {})
    assert "not built: no CoreX" in got["native_kernels"]["absent"]


# ---------------------------------------------------------------- linear section on the CPU
def test_linear_section_on_the_cpu_times_the_torch_forms_and_says_why_not_the_rest():
    """The Gated DeltaNet layer at the hybrid model's shape, a tiny prompt: the torch prefill
    and the eager decode steps are measured; the native prefill and the CUDA-graph replay are
    absent naming the device, and the backend fact says the torch path served and why."""
    import device_facts_linear as linear

    from attn_sim.facts import parse_facts

    facts = linear.linear_facts(prompt_len=32, batches=(1, 2), repeats=1,
                                device=torch.device("cpu"))  # fmt: skip
    assert set(facts) == set(device_facts.section_names("linear"))
    served = facts["linear_backend"]["value"]
    assert served["prefill"] == {"backend": "torch", "detail": "needs a CUDA device, got cpu"}
    assert served["decode"] == served["prefill"]
    assert facts["linear_prefill_torch_s"]["value"] > 0
    method = facts["linear_prefill_torch_s"]["method"]
    assert "16 key / 32 value heads" in method and "32 tokens" in method and "bf16" in method
    assert "needs a CUDA device, got cpu" in facts["linear_prefill_native_s"]["absent"]
    rows = facts["linear_decode"]["value"]
    assert [(r["batch"], r["backend"]) for r in rows] == [(1, "torch"), (2, "torch")]
    for r in rows:
        assert r["eager_s"] > 0 and r["graph_s"] is None and "CUDA" in r["graph_error"]
    doc = {"schema": "bi100-attn/device-facts/1", "target": "t", "date": "2026-12-01T00:00:00Z",
           "device_name": "cpu", "torch": "x", "quick": True, "facts": facts}  # fmt: skip
    assert set(parse_facts(doc).facts) == set(facts)  # the simulator takes the section as is


def test_linear_section_off_cuda_in_the_suite_is_absent_with_the_reason(tmp_path):
    rc = device_facts.main(["--out", str(tmp_path), "--quick", "--device", "cpu",
                            "--sections", "linear"])  # fmt: skip
    assert rc == 0
    facts = read_facts(tmp_path / device_facts.FACTS_FILE)
    assert set(facts.facts) == set(device_facts.section_names("linear"))
    assert all(CPU_WHY in f.absent for f in facts.facts.values())
