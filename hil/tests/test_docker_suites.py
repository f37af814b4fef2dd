"""The real suites, on the CPU, in a container built from the tree (the full torch image)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
from hil_helpers import REPO, leftovers

from hil.config import load_config
from hil.junit import count_report
from hil.runner import run_all
from hil.status import Status

pytestmark = pytest.mark.docker


def test_functional_and_long_context_in_a_cpu_container(engine, wheels_dir, make_ctx):
    client, host = engine
    env = {"DOCKER_HOST": host, "HIL_WHEELS": str(wheels_dir)}
    config = load_config(REPO / "hil/targets.toml", REPO / "hil/suites/suites.toml", environ=env)
    cpu = config.targets["cpu-local"]
    target = dataclasses.replace(
        cpu,
        # the plan tests stand in for the whole attn-core suite: seconds instead of minutes
        environment={
            **cpu.environment,
            "PYTEST_ADDOPTS": "-k 'test_plan_decode or test_plan_prefill'",
        },
        build_args={"STATUS_CHECK": os.environ.get("HIL_TEST_STATUS_CHECK", "1")},
    )
    ctx = make_ctx(quick=True)
    suites = [config.suites["functional"], config.suites["long-context"]]
    by = {r.suite: r for r in run_all([target], suites, ctx)}

    lc = by["long-context"]
    assert lc.status == Status.PASS, lc.detail
    records = json.loads((Path(lc.artifacts) / "long_context_metrics.json").read_text())
    assert {(r["kind"], r["device"]) for r in records} == {("decode", "cpu"), ("prefill", "cpu")}
    assert all(r["rel_error"] <= r["tolerance"] for r in records)

    fn = by["functional"]
    assert fn.status in (Status.PASS, Status.FAIL), fn.detail  # never HANG/ERROR
    steps = {
        s["name"]: s for s in json.loads((Path(fn.artifacts) / "suite.json").read_text())["steps"]
    }
    # attn-core's own verdict is its business; here: its tests ran on the container's CPU and
    # the step's status agrees with its report
    report = count_report(Path(fn.artifacts) / "attn-core.xml")
    assert report.passed > 0
    want = "failed" if report.failed or report.errors else "passed"
    assert steps["attn-core"]["status"] == want
    assert steps["vllm-generate"]["status"] == "skipped"  # no vLLM in the CPU image
    assert (Path(fn.artifacts) / "engine-patch-status.txt").exists()
    assert "=== hil step attn-core ===" in (Path(fn.artifacts) / "log.txt").read_text()
    assert leftovers(client, ctx.run_id) == []
