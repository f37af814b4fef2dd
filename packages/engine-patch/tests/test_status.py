"""``engine-patch status``: report contents, tables, JSON, and every exit code."""

import dataclasses
import json

import ep_helpers
import fake_vllm
import pytest
import torch
from ep_helpers import DATA, require

from attn_core.core.shapes import AttentionShape
from engine_patch import cli, register, selftest
from engine_patch.exit_codes import EXIT_CONFIG
from engine_patch.platform import PLATFORM_ENV
from engine_patch.status import (
    EXIT_INACTIVE,
    EXIT_OK,
    EXIT_SELF_TEST,
    EXIT_TRITON,
    collect,
    render,
)

clean_state = pytest.fixture(ep_helpers.clean_state)

SMALL = AttentionShape(
    num_heads=8, num_kv_heads=2, head_size=64, block_size=16, dtype=torch.float32
)
CPU = torch.device("cpu")


@pytest.fixture
def no_vllm(monkeypatch, clean_state):
    """This process as if vLLM were not installed."""
    ep_helpers.hide_vllm(monkeypatch)
    monkeypatch.setenv(PLATFORM_ENV, "generic")
    monkeypatch.setenv("ATTN_CORE_DEVICE", "bi-v100")


def test_without_vllm_reports_and_passes(no_vllm):
    report = collect(SMALL, CPU, contexts=(1024, 8192))
    assert report["exit_code"] == EXIT_OK
    assert report["vllm"]["present"] is False and report["symbols"] == []
    # Absent is the normal state off the lab machine: information, not an error row.
    assert report["vllm"]["error"] is None and report["registration_errors"] == []
    assert [r["context"] for r in report["decode_plans"]] == [1024, 8192]
    assert all(r["route"] == "attn_core" for r in report["decode_plans"])
    assert report["decode_plans"][1]["tier"] == "partitioned"
    assert {c["path"] for c in report["self_test"]} >= {"attn_core.paged_decode"}
    assert all(c["passed"] for c in report["self_test"]), report["self_test"]
    text = render(report)
    assert text.endswith("status: OK (exit 0)")
    assert "not installed (attn-core is checked directly)" in text
    assert "errors" not in text.split("decode plans")[0]


def test_a_broken_vllm_install_is_an_error_row(monkeypatch, clean_state, tmp_path):
    """Installed but failing to import (a missing dependency) is worth an errors row."""
    package = tmp_path / "vllm"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('No module named xformers_stub')\n")
    ep_helpers.forget_vllm(monkeypatch)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(PLATFORM_ENV, "generic")
    report = collect(SMALL, CPU, contexts=(1024,), self_test=False)
    assert report["vllm"]["present"] is False
    assert "vllm is installed but not importable" in report["vllm"]["error"]
    assert "xformers_stub" in report["vllm"]["error"]
    text = render(report)
    assert "installed but not importable (see errors)" in text
    assert "errors" in text.split("decode plans")[0]


def test_wrong_numbers_fail_the_self_test(no_vllm, monkeypatch):
    def zeros(*args, out=None, **kwargs):
        return out.zero_()

    monkeypatch.setattr(selftest.attn_core, "paged_decode", zeros)
    report = collect(SMALL, CPU, contexts=(1024,))
    assert report["exit_code"] == EXIT_SELF_TEST
    failed = [c for c in report["self_test"] if not c["passed"]]
    assert failed and all(c["name"].startswith("decode") for c in failed)
    assert "FAIL: a self-test did not match the reference" in render(report)


def test_a_crash_is_a_failed_check_not_a_traceback(no_vllm, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("device fault")

    monkeypatch.setattr(selftest.attn_core, "paged_prefix_prefill", broken)
    report = collect(SMALL, CPU, contexts=(1024,))
    assert report["exit_code"] == EXIT_SELF_TEST
    prefix = [c for c in report["self_test"] if c["name"] == "prefix"]
    assert prefix[0]["detail"] == "RuntimeError: device fault"


def test_vllm_present_but_plugin_not_loaded(monkeypatch, clean_state):
    monkeypatch.setenv(PLATFORM_ENV, "generic")
    fake_vllm.install(monkeypatch, plugins=lambda: None)  # as with VLLM_PLUGINS=other
    report = collect(SMALL, CPU, contexts=(1024,), self_test=False)
    assert report["vllm"]["present"] and not report["patch_active"]
    assert report["exit_code"] == EXIT_INACTIVE
    assert "plugin is not active" in render(report)


def test_vllm_present_and_plugin_loaded(monkeypatch, clean_state):
    monkeypatch.setenv(PLATFORM_ENV, "generic")
    monkeypatch.setenv("ATTN_CORE_DEVICE", "bi-v100")
    fake_vllm.install(monkeypatch, plugins=register)
    report = collect(SMALL, CPU, contexts=(1024, 102400))
    assert report["patch_active"] and report["exit_code"] == EXIT_OK, report["self_test"]
    rows = {r["symbol"]: r["implementation"] for r in report["symbols"]}
    assert rows["vllm.attention.ops.paged_attn.PagedAttention.forward_prefix"].startswith(
        "attn-core"
    )
    assert rows["vllm._custom_ops.paged_attention_v1"].startswith("native")
    # Native V1 serves 1K (within the 32 KiB reach), attn-core's plan serves 100K.
    routes = [r["route"] for r in report["decode_plans"]]
    assert routes == ["native_v1", "attn_core"]
    paths = {c["path"] for c in report["self_test"]}
    assert "vllm PagedAttention.forward_decode" in paths
    assert "native_v1" in fake_vllm.CALLS  # the self-test ran the platform's V1 too


def test_triton_setting_on_iluvatar_exits_4(no_vllm, monkeypatch):
    monkeypatch.setenv(PLATFORM_ENV, "iluvatar")
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "ROCM_FLASH")
    report = collect(SMALL, CPU, contexts=(1024,), self_test=False)
    assert report["exit_code"] == EXIT_TRITON
    assert "Triton" in render(report)


def test_cli_json_and_shape_flags(no_vllm, capsys):
    code = cli.main(
        [
            "status",
            "--json",
            "--no-self-test",
            "--heads",
            "16",
            "--kv-heads",
            "2",
            "--head-size",
            "128",
            "--dtype",
            "bfloat16",
            "--contexts",
            "1024,32768",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == EXIT_OK == report["exit_code"]
    assert report["model_shape"]["num_heads"] == 16 and report["model_shape"]["dtype"] == "bfloat16"
    assert [r["context"] for r in report["prefill_plans"]] == [1024, 32768]


def test_cli_env_shape_and_bad_shape(no_vllm, monkeypatch, capsys):
    monkeypatch.setenv("ENGINE_PATCH_HEADS", "32")
    monkeypatch.setenv("ENGINE_PATCH_KV_HEADS", "8")
    monkeypatch.setenv("ENGINE_PATCH_HEAD_SIZE", "128")
    assert cli.main(["status", "--json", "--no-self-test", "--contexts", "1024"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["model_shape"]["num_kv_heads"] == 8
    assert cli.main(["status", "--heads", "10", "--kv-heads", "4"]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert (
        "--heads 10, --kv-heads 4: num_heads must be a multiple of num_kv_heads (4), got 10" in err
    )


def test_cli_model_config_with_tensor_parallel(no_vllm, capsys):
    require("transformers", "--model reads config.json through AutoConfig")
    code = cli.main(
        [
            "status",
            "--json",
            "--no-self-test",
            "--model",
            str(DATA / "qwen3_5_moe"),
            "--tp",
            "2",
            "--contexts",
            "1024",
        ]
    )
    shape = json.loads(capsys.readouterr().out)["model_shape"]
    assert code == EXIT_OK
    assert (shape["num_heads"], shape["num_kv_heads"], shape["head_size"]) == (8, 1, 256)


def test_plans_show_the_platform_v2_once_it_matched(monkeypatch, clean_state):
    monkeypatch.setenv(PLATFORM_ENV, "generic")
    monkeypatch.setenv("ATTN_CORE_DEVICE", "bi-v100")
    fake_vllm.install(monkeypatch, plugins=register, ops=fake_vllm.vendor_ops(v2="works"))
    report = collect(SMALL, CPU, contexts=(1024, 32768), self_test=False)
    rows = report["decode_plans"]
    assert [r["route"] for r in rows] == ["native_v1", "native_v2"]
    assert rows[1]["tier"] == "platform V2 kernel" and rows[1]["partitions"] == 64
    assert "matched the reference" in rows[1]["reason"]
    assert "platform V2 kernel" in render(report)


def test_status_is_the_default_command(no_vllm, capsys):
    assert cli.main(["--json", "--no-self-test", "--contexts", "1024"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["decode_plans"][0]["context"] == 1024


def test_prefill_plans_report_the_native_backend_and_reason(monkeypatch, clean_state):
    """forward_prefix runs attn-core's paged_prefix_prefill, whose resolver decides native:
    status reports each plan's backend and reason; forcing native on a machine that cannot
    run it reaches the patched forward_prefix as the resolver's named error."""
    monkeypatch.setenv(PLATFORM_ENV, "generic")
    fake_vllm.install(monkeypatch, plugins=register)
    half = dataclasses.replace(SMALL, dtype=torch.float16)
    report = collect(half, CPU, contexts=(1024,), self_test=False)
    row = report["prefill_plans"][0]
    assert row["backend"] == "torch" and row["variant"] == "-"
    assert "native prefill: needs a CUDA device, got cpu" in row["reason"]
    assert report["native_prefill"] == []  # no GPU: no library to report
    assert "native prefill: needs a CUDA device" in render(report)

    monkeypatch.setenv("ATTN_CORE_PREFILL_BACKEND", "native")
    report = collect(half, CPU, contexts=(1024,), self_test=False)
    row = report["prefill_plans"][0]
    assert row["backend"] == "unavailable" and "needs a CUDA device" in row["reason"]
    from vllm.attention.ops.paged_attn import PagedAttention

    from attn_core.reference import make_prefill_case

    case = make_prefill_case(
        [(20, 5)], half.num_heads, half.num_kv_heads, half.head_size, 16, torch.float16
    )
    args = case.args()
    with pytest.raises(ValueError, match=r"backend 'native'.*needs a CUDA device"):
        PagedAttention.forward_prefix(
            args[0], args[1], args[2], "auto", args[3], args[4], args[5], args[6], args[7],
            args[8], args[9], None, None, 1.0, 1.0,
        )  # fmt: skip
    assert "triton_context_attention_fwd" not in fake_vllm.CALLS
