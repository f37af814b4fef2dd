"""``engine-patch status``: what is active in this process, what attn-core would plan, and
whether the numbers are right on this device.

The report is a plain dict (``--json`` prints it); :func:`render` turns it into tabulate
tables. :func:`exit_code` gives the report's verdict as one of :mod:`engine_patch.exit_codes`
(0, 1, 3 or 4; 2 and 5 are the CLI's, for input it cannot run with and for its own failures).
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

import torch
from tabulate import tabulate

import attn_core
import attn_core.core.settings
from attn_core.core import verify_once
from attn_core.core.shapes import AttentionShape
from attn_core.runtime.prefill_status import native_prefill_report, prefill_plan_row
from engine_patch import native_v2, routing, triton_guard
from engine_patch.exit_codes import (
    EXIT_CONFIG,
    EXIT_INACTIVE,
    EXIT_OK,
    EXIT_SELF_TEST,
    EXIT_TRITON,
)
from engine_patch.linear_status import linear_report, plan_or_default, render_linear
from engine_patch.native_decode import native_decode_report
from engine_patch.platform import detect_platform
from engine_patch.qwen3_5_moe import vllm_architecture_support
from engine_patch.registration import (
    _vllm_version,
    implementation_of,
    is_active,
    register,
    vllm_importable,
)
from engine_patch.selftest import run_self_test
from engine_patch.state import STATE

__all__ = ["CONTEXTS", "EXIT_INACTIVE", "EXIT_OK", "EXIT_SELF_TEST", "EXIT_TRITON", "collect"]
CONTEXTS = (1024, 8192, 32768, 102400)
SYMBOLS = (
    ("vllm.attention.ops.paged_attn", "PagedAttention.forward_decode"),
    ("vllm.attention.ops.paged_attn", "PagedAttention.forward_prefix"),
    ("vllm._custom_ops", "paged_attention_v1"),
    ("vllm._custom_ops", "paged_attention_v2"),
    ("vllm._custom_ops", "reshape_and_cache"),
)


def load_plugins() -> Optional[str]:
    """Load plugins the way vLLM does (``VLLM_PLUGINS`` applies); None, or why not."""
    if not vllm_importable():
        return None
    try:
        from vllm.plugins import load_general_plugins
    except ImportError as exc:
        return f"vllm.plugins is not importable: {exc}"
    load_general_plugins()
    return None


def _symbols() -> list[dict[str, str]]:
    rows = []
    for module_name, path in SYMBOLS:
        try:
            owner: Any = importlib.import_module(module_name)
        except ImportError:
            rows.append({"symbol": f"{module_name}.{path}", "implementation": "vllm absent"})
            continue
        *parents, attr = path.split(".")
        for part in parents:
            owner = getattr(owner, part)
        rows.append(
            {"symbol": f"{module_name}.{path}", "implementation": implementation_of(owner, attr)}
        )
    return rows


def _decode_plans(shape: AttentionShape, device: torch.device, num_seqs: int, contexts) -> list:
    rows = []
    for context in contexts:
        route = routing.decode_route(
            num_seqs,
            shape.num_heads,
            shape.num_kv_heads,
            shape.head_size,
            shape.block_size,
            context,
            shape.dtype,
            device,
        )
        plan = route.plan
        if plan is not None:
            tier, parts, size = plan.tier, plan.num_partitions, plan.partition_size
        elif route.impl == routing.NATIVE_V2:
            tier, size = "platform V2 kernel", native_v2.PARTITION_SIZE
            parts = -(-context // size)
        else:
            tier, parts, size = "platform V1 kernel", 1, context
        rows.append(
            {
                "context": context,
                "route": route.impl,
                "backend": plan.backend if plan is not None else "platform",
                "tier": tier,
                "partitions": parts,
                "partition_size": size,
                "grid": [list(s.grid) for s in plan.steps] if plan else None,
                "workspace_bytes": plan.workspace_bytes if plan else 0,
                "device_profile": plan.device_spec.name if plan else None,
                "reason": route.reason,
                "backend_reason": plan.backend_reason if plan else None,
            }
        )
    return rows


def _prefill_plans(shape: AttentionShape, device: torch.device, contexts, chunk: int) -> list:
    """attn-core's resolved prefill plan per context: backend (native: its MMA variant and
    split), tiles, workspace, price and the plan's reason (the native CLI prints the same)."""
    return [prefill_plan_row(shape, device, min(chunk, c), c) for c in contexts]


def _native_prefill(shape: AttentionShape, device: torch.device, verify: bool) -> list:
    """Each native prefill MMA variant: library, verdict for the model's shape, tile resources
    (a GPU only; elsewhere the plans' reasons say why there is none)."""
    if device.type != "cuda":
        return []
    return native_prefill_report(shape, device, verify=verify)


def collect(
    shape: AttentionShape,
    device: torch.device,
    *,
    num_seqs: int = 1,
    contexts=CONTEXTS,
    prefill_chunk: int = 8192,
    self_test: bool = True,
    architectures: Optional[list[str]] = None,
    layer_plan: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
    """Build the whole report (loads plugins through vLLM first, as a worker would).

    attn-core's settings are read again first (``attn_core.core.settings.reload``): the report is
    about the environment as it is now."""
    attn_core.core.settings.reload()
    if device.type == "cuda":
        torch.cuda.init()  # as in a worker: the platform check may then read the device name
    load_error = load_plugins()
    if not vllm_importable():
        register()  # no vLLM: still register the config type and detect the platform
    present = vllm_importable()
    active = is_active()
    # with the plugin filtered out (VLLM_PLUGINS), register() never ran: what is installed and
    # where this runs are still facts worth showing, so they are looked up here
    version = STATE.vllm_version or (_vllm_version() if present else None)
    platform = STATE.platform if STATE.platform is not None else detect_platform()
    report: dict[str, Any] = {
        "vllm": {
            "present": present,
            "version": version,
            "flavour": STATE.flavour,
            "error": load_error or STATE.vllm_error,
        },
        "platform": {
            "label": platform.label,
            "iluvatar": platform.is_iluvatar,
            "reasons": list(platform.reasons),
        },
        "patch_active": active,
        "register_calls": STATE.register_calls,
        "registration_errors": list(STATE.errors),
        "symbols": _symbols() if present else [],
        "native_ops": [
            {
                "op": n.name,
                "flavour": n.flavour,
                "present": n.present,
                "works": n.works,
                "detail": n.failure or n.detail,
            }
            for n in STATE.natives.values()
        ],
        "triton_guard": {
            "installed": list(STATE.triton_guard),
            "refused": list(STATE.triton_refused)
            or (
                triton_guard.refused_settings()
                if STATE.platform and STATE.platform.is_iluvatar
                else []
            ),
        },
        "qwen3_5_moe": {
            "config": STATE.config_registration,
            "vllm_model": vllm_architecture_support(architectures) if present else "vllm absent",
        },
        "linear_ops": linear_report(device),
        "layer_plan": plan_or_default(layer_plan),
        "model_shape": {
            "num_heads": shape.num_heads,
            "num_kv_heads": shape.num_kv_heads,
            "head_size": shape.head_size,
            "dtype": dtype_name(shape.dtype),
            "block_size": shape.block_size,
            "num_seqs": num_seqs,
        },
        "device": str(device),
        "decode_plans": _decode_plans(shape, device, num_seqs, contexts),
        "prefill_plans": _prefill_plans(shape, device, contexts, prefill_chunk),
        "native_decode": native_decode_report(shape, device, verify=self_test),
        "native_prefill": _native_prefill(shape, device, self_test),
        "self_test": [c.to_dict() for c in run_self_test(shape, device)] if self_test else [],
    }
    # last: every kernel checked so far (the plans', the self-test's), attn-core's and V2 alike
    report["verdicts"] = verify_once.status_lines()
    report["exit_code"] = exit_code(report)
    return report


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float16`` -> ``"float16"`` (the name ``--dtype`` and ``ENGINE_PATCH_DTYPE`` take)."""
    return str(dtype).replace("torch.", "", 1)


def unavailable_prefill(report: dict[str, Any]) -> str:
    """The reason of the first prefill plan whose forced backend (``ATTN_CORE_PREFILL_BACKEND``)
    cannot run here, "" when none: a configuration error, as the same forcing is for decode
    (whose planner refuses it outright)."""
    rows = [r for r in report["prefill_plans"] if r.get("backend") == "unavailable"]
    return rows[0].get("reason", "") if rows else ""


def exit_code(report: dict[str, Any]) -> int:
    if report["triton_guard"]["refused"]:
        return EXIT_TRITON
    if report["vllm"]["present"] and not report["patch_active"]:
        return EXIT_INACTIVE
    if unavailable_prefill(report):  # the prefix self-test then fails for the same reason
        return EXIT_CONFIG
    if any(not c["passed"] for c in report["self_test"]):
        return EXIT_SELF_TEST
    if report["native_decode"].get("verified") is False:  # built, but wrong on this device
        return EXIT_SELF_TEST
    return EXIT_OK


def render(report: dict[str, Any]) -> str:
    """Human-readable tables; the verdict last."""
    vllm = report["vllm"]
    platform = report["platform"] or {}
    if vllm["present"]:
        flavour = f" ({vllm['flavour']})" if vllm["flavour"] else ""
        vllm_text = f"{vllm['version']}{flavour}"
    elif vllm["error"]:
        vllm_text = "installed but not importable (see errors)"
    else:  # the normal state off the lab machine, not an error
        vllm_text = "not installed (attn-core is checked directly)"
    head = [
        ["vLLM", vllm_text],
        ["platform", platform.get("label", "?")],
        ["iluvatar because", "; ".join(platform.get("reasons", [])) or "-"],
        ["patch active in this process", report["patch_active"]],
        ["register() calls", report["register_calls"]],
        ["qwen3_5_moe config", report["qwen3_5_moe"]["config"]],
        ["qwen3_5_moe in vLLM", report["qwen3_5_moe"]["vllm_model"]],
        ["triton guard", ", ".join(report["triton_guard"]["installed"]) or "not needed"],
        ["refused settings", ", ".join(report["triton_guard"]["refused"]) or "-"],
    ]
    if vllm["error"] or report["registration_errors"]:
        head.append(
            ["errors", "; ".join(filter(None, [vllm["error"], *report["registration_errors"]]))]
        )
    parts = [tabulate(head, tablefmt="plain")]
    if report["symbols"]:
        parts.append(tabulate(report["symbols"], headers="keys", tablefmt="simple"))
    if report["native_ops"]:
        parts.append(tabulate(report["native_ops"], headers="keys", tablefmt="simple"))
    parts.extend(render_linear(report["linear_ops"], report["layer_plan"]))
    shape = report["model_shape"]
    parts.append(
        f"decode plans on {report['device']} for {shape['num_heads']}/{shape['num_kv_heads']} "
        f"heads, head {shape['head_size']}, {shape['dtype']}, block {shape['block_size']}, "
        f"{shape['num_seqs']} sequence(s):"
    )
    cols: tuple[str, ...] = ("context", "route", "backend", "tier", "partitions", "partition_size",
            "workspace_bytes", "reason", "backend_reason")  # fmt: skip
    parts.append(tabulate([[r[c] for c in cols] for r in report["decode_plans"]], headers=cols))
    parts.append("prefill plans (forward_prefix goes through attn-core's paged_prefix_prefill):")
    cols = ("context", "chunk", "backend", "variant", "splits", "query_tile", "key_tile",
            "stream_chunk", "price_ms", "reason")  # fmt: skip
    parts.append(tabulate([[r[c] for c in cols] for r in report["prefill_plans"]], headers=cols))
    if report["native_prefill"]:
        parts.append("native prefill kernel (attn-core prices it against the torch path):")
        parts.append(tabulate(report["native_prefill"], headers="keys"))
    native = report["native_decode"]
    rows = [[k.replace("_", " "), v] for k, v in native.items() if v is not None]
    parts.append("native decode kernel (attn-core uses it once verified on this device):")
    parts.append(tabulate(rows, tablefmt="plain"))
    parts.append("kernels checked against the float64 reference in this process:")
    parts.append("\n".join(report["verdicts"]) or "none yet")
    if report["self_test"]:
        cols = ("name", "path", "dtype", "max_error", "tolerance", "passed", "detail")
        rows = [[c[k] for k in cols] for c in report["self_test"]]
        parts.append(tabulate(rows, headers=cols, floatfmt=".2e"))
    verdict = {
        EXIT_OK: "OK",
        EXIT_SELF_TEST: "FAIL: a self-test did not match the reference",
        EXIT_CONFIG: "FAIL: configuration error: the prefill backend ATTN_CORE_PREFILL_BACKEND "
        f"forces cannot run here ({unavailable_prefill(report)})",
        EXIT_INACTIVE: "FAIL: vLLM is present but the engine-patch plugin is not active "
        "(is engine-patch installed, and does VLLM_PLUGINS include engine_patch?)",
        EXIT_TRITON: "FAIL: a setting asks for Triton attention on Iluvatar: "
        + triton_guard.EXPLANATION,
    }[report["exit_code"]]
    parts.append(f"status: {verdict} (exit {report['exit_code']})")
    return "\n\n".join(parts)
