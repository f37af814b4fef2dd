"""The real vllm==0.6.3 package on the CPU: vLLM's own loader, vLLM's own attention code.

Needs vLLM installed by ``ci/install-vllm.sh`` (its compiled ops absent, so attn-core serves
everything here). Skips without it, fails instead with ``ENGINE_PATCH_REQUIRE_VLLM=1``.
"""

import json

import ep_helpers
import pytest
import torch
from ep_helpers import (
    DECODE_TOL,
    PREFIX_TOL,
    assert_close,
    decode_args,
    decode_reference,
    op_args,
    run_python,
)

from attn_core.reference import (
    make_paged_case,
    reference_prefix_prefill,
    tokens_from_cache,
)
from engine_patch import STATE, is_active
from engine_patch.platform import PLATFORM_ENV

pytestmark = pytest.mark.vllm


@pytest.fixture
def vllm(vllm_modules, clean_state, monkeypatch):
    """vLLM with the plugin loaded through vLLM's own ``load_general_plugins()``."""
    monkeypatch.setenv(PLATFORM_ENV, "generic")
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    assert is_active(), STATE.errors
    ops, paged_attn = vllm_modules
    return ops, paged_attn.PagedAttention


class Spy:
    """Counts calls to a ``_custom_ops`` function, passing them through."""

    def __init__(self, monkeypatch, ops, name):
        self.calls = 0
        inner = getattr(ops, name)

        def spy(*args, **kwargs):
            self.calls += 1
            return inner(*args, **kwargs)

        monkeypatch.setattr(ops, name, spy)


@pytest.mark.parametrize(
    "seq_lens, max_seq_len, branch",
    [
        ([1, 37, 300], 300, "paged_attention_v1"),  # one partition -> vLLM's V1
        ([5, 8300], 8300, "paged_attention_v2"),  # > 8192 -> vLLM's V2
        ([3, 77], 9000, "paged_attention_v2"),  # a bound above every length (CUDA graphs)
    ],
)
def test_vllms_own_forward_decode_both_branches(vllm, monkeypatch, seq_lens, max_seq_len, branch):
    ops, _ = vllm
    spies = {n: Spy(monkeypatch, ops, n) for n in ("paged_attention_v1", "paged_attention_v2")}
    case = make_paged_case(seq_lens, 24, 4, 256, 16, torch.float16, seed=11)
    if max_seq_len > max(seq_lens):  # the table must reach max_seq_len, as vLLM pads it
        width = -(-max_seq_len // 16)
        pad = torch.zeros(len(seq_lens), width - case.block_tables.shape[1], dtype=torch.int32)
        case.block_tables = torch.cat([case.block_tables, pad], dim=1)
    vllm_forward_decode = STATE.original_forward_decode
    out = vllm_forward_decode(
        *decode_args(case, max_seq_len, 4, 0.0625), case.k_scale, case.v_scale
    )
    assert {n: s.calls for n, s in spies.items()} == {n: int(n == branch) for n in spies}
    assert_close(out, decode_reference(case, 0.0625), DECODE_TOL[torch.float16])


@pytest.mark.parametrize(
    "heads, kv_heads, head_size, block_size, dtype",
    [
        (24, 4, 256, 16, torch.float16),  # Qwen3.6, GQA 6
        (16, 2, 256, 32, torch.bfloat16),  # Qwen3.5-35B-A3B, GQA 8
        (6, 1, 256, 8, torch.float32),  # Qwen3.6 at TP 4
        (32, 8, 128, 16, torch.float16),  # Llama-style
    ],
)
def test_patched_forward_decode(vllm, heads, kv_heads, head_size, block_size, dtype):
    _, paged = vllm
    case = make_paged_case(
        [1, 9, 81, 729],
        heads,
        kv_heads,
        head_size,
        block_size,
        dtype,
        non_contiguous_tables=True,
        seed=12,
    )
    out = paged.forward_decode(
        *decode_args(case, 729, kv_heads, head_size**-0.5), case.k_scale, case.v_scale
    )
    assert_close(out, decode_reference(case, head_size**-0.5), DECODE_TOL[dtype])


@pytest.mark.parametrize("name", ["paged_attention_v1", "paged_attention_v2"])
@pytest.mark.parametrize("kv", ["auto", "fp8"])
def test_custom_ops_directly(vllm, name, kv):
    ops, _ = vllm
    case = make_paged_case(
        [17, 260],
        8,
        2,
        128,
        16,
        torch.float16,
        kv_cache_dtype=kv,
        k_scale=0.5 if kv == "fp8" else 1.0,
        v_scale=0.25 if kv == "fp8" else 1.0,
        seed=13,
    )
    out = torch.full_like(case.query, float("nan"))
    scratch = (torch.empty(0), torch.empty(0), torch.empty(0)) if name.endswith("v2") else ()
    getattr(ops, name)(out, *scratch, *op_args(case, 2, 0.1, 260), case.k_scale, case.v_scale)
    assert_close(out, decode_reference(case, 0.1), DECODE_TOL[torch.float16])


def test_custom_op_errors_name_the_argument(vllm):
    ops, _ = vllm
    case = make_paged_case([5], 8, 2, 128, 16, torch.float16)
    out = torch.empty_like(case.query)
    with pytest.raises(ValueError, match=r"num_kv_heads must equal key_cache.shape\[1\] \(2\)"):
        ops.paged_attention_v1(out, *op_args(case, 4, 0.1, 5), 1.0, 1.0)
    with pytest.raises(ValueError, match="blocksparse_vert_stride"):
        # scales 1.0, tp_rank 0; block-sparse local_blocks 1, vert_stride 4 (refused), 64, 0
        ops.paged_attention_v1(out, *op_args(case, 2, 0.1, 5), 1.0, 1.0, 0, 1, 4, 64, 0)


def _prefix_case(context_lens, query_lens, heads, kv_heads, head_size, dtype, seed):
    total = [c + q for c, q in zip(context_lens, query_lens, strict=True)]
    case = make_paged_case(total, heads, kv_heads, head_size, 16, dtype, seed=seed)
    g = torch.Generator().manual_seed(seed)
    n = sum(query_lens)
    query = torch.randn(n, heads, head_size, generator=g).to(dtype)
    key = torch.randn(n, kv_heads, head_size, generator=g).to(dtype)
    value = torch.randn(n, kv_heads, head_size, generator=g).to(dtype)
    slots = []
    for s, (c, q) in enumerate(zip(context_lens, query_lens, strict=True)):
        pos = torch.arange(c, c + q)
        slots.append(case.block_tables[s].long()[pos // 16] * 16 + pos % 16)
    starts = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32)
    return case, query, key, value, torch.cat(slots), starts


def test_write_to_paged_cache(vllm):
    _, paged = vllm
    case, _, key, value, slots, starts = _prefix_case(
        [3, 40], [7, 20], 8, 2, 128, torch.bfloat16, 14
    )
    slots[2] = -1  # a padding token is skipped
    paged.write_to_paged_cache(key, value, case.key_cache, case.value_cache, slots, "auto", 1, 1)
    k, v = tokens_from_cache(case.key_cache, case.value_cache, case.block_tables[1], 60)
    assert torch.equal(k[40:], key[7:].double()) and torch.equal(v[40:], value[7:].double())
    k0, _ = tokens_from_cache(case.key_cache, case.value_cache, case.block_tables[0], 10)
    assert torch.equal(k0[3:5], key[:2].double()) and torch.equal(k0[6:], key[3:7].double())
    assert not torch.equal(k0[5], key[2].double())  # the skipped token's slot is untouched


@pytest.mark.parametrize("sliding_window", [None, 24])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_forward_prefix(vllm, sliding_window, dtype):
    _, paged = vllm
    context_lens, query_lens = [0, 45, 300], [5, 17, 33]
    case, query, key, value, slots, starts = _prefix_case(
        context_lens, query_lens, 24, 4, 256, dtype, 15
    )
    paged.write_to_paged_cache(
        key, value, case.key_cache, case.value_cache, slots, "auto", 1.0, 1.0
    )
    seq_lens = torch.tensor(
        [c + q for c, q in zip(context_lens, query_lens, strict=True)], dtype=torch.int32
    )
    ctx = torch.tensor(context_lens, dtype=torch.int32)
    out = paged.forward_prefix(
        query,
        key,
        value,
        "auto",
        case.key_cache,
        case.value_cache,
        case.block_tables,
        starts,
        seq_lens,
        ctx,
        max(query_lens),
        None,
        sliding_window,
        1.0,
        1.0,
    )
    want = reference_prefix_prefill(
        query,
        key,
        value,
        case.key_cache,
        case.value_cache,
        case.block_tables,
        starts,
        ctx,
        sliding_window=sliding_window,
    )
    assert_close(out, want, PREFIX_TOL[dtype])


# --- vLLM's loader, in fresh processes (vLLM loads plugins once per process and role) -----

_LOADER = """
import json, os, engine_patch
from vllm.plugins import load_general_plugins  # reads VLLM_PLUGINS on every call
from vllm.attention.ops.paged_attn import PagedAttention

steps = []
for plugins in ("some_other_plugin", "engine_patch", None, None):
    if plugins is None:
        os.environ.pop("VLLM_PLUGINS", None)
    else:
        os.environ["VLLM_PLUGINS"] = plugins
    load_general_plugins()
    s = engine_patch.STATE
    decode = s.patches.get("PagedAttention.forward_decode")
    steps.append({
        "plugins": plugins,
        "active": engine_patch.is_active(),
        "calls": s.register_calls,
        "patches": len(s.patches),
        "original": decode and decode.original.__module__ + "." + decode.original.__qualname__,
    })
print(json.dumps(steps))
"""


def test_vllm_loader_filtering_and_idempotence(vllm_modules, monkeypatch):
    """One fresh process (importing vLLM costs ~13 s): VLLM_PLUGINS excluding us, naming us,
    then unset twice - three loads in all."""
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    proc = run_python(_LOADER, env={PLATFORM_ENV: "generic"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [(s["active"], s["calls"]) for s in steps] == [
        (False, 0),  # VLLM_PLUGINS=some_other_plugin: vLLM does not call us
        (True, 1),
        (True, 2),
        (True, 3),
    ]
    # Loaded three times, patched once: five symbols, each wrapping vLLM's own function.
    assert [s["patches"] for s in steps[1:]] == [5, 5, 5]
    assert steps[-1]["original"] == "vllm.attention.ops.paged_attn.PagedAttention.forward_decode"


def test_status_exit_codes_with_vllm(vllm_modules):
    code = "import sys; from engine_patch.cli import main; sys.exit(main({args}))"
    base = {PLATFORM_ENV: "generic"}
    args = ["status", "--json", "--contexts", "1024,102400"]
    ok = run_python(code.format(args=args), env=base)
    report = json.loads(ok.stdout)
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-3000:]
    assert report["vllm"] == {
        "present": True,
        "version": "0.6.3",
        "flavour": "upstream",
        "error": None,
    }
    assert report["qwen3_5_moe"]["vllm_model"].startswith("vLLM's model registry has no class")
    assert all(c["path"].startswith("vllm PagedAttention") for c in report["self_test"])
    inactive = run_python(
        code.format(args=args + ["--no-self-test"]), env={**base, "VLLM_PLUGINS": "other"}
    )
    assert inactive.returncode == 3
    assert json.loads(inactive.stdout)["patch_active"] is False


def test_triton_guard_with_real_vllm_on_simulated_iluvatar(vllm_modules):
    code = """
import engine_patch
from vllm.plugins import load_general_plugins
from vllm.attention import selector
from engine_patch.triton_guard import TritonRefusedError
import torch
load_general_plugins()  # logs the refusal (vLLM catches plugin errors), guards stay in place
assert engine_patch.is_active()
try:
    selector.which_attn_to_use(256, None, torch.float16, "auto", 16, False)
except TritonRefusedError as exc:
    print("refused:", exc)
"""
    env = {PLATFORM_ENV: "iluvatar", "VLLM_ATTENTION_BACKEND": "ROCM_FLASH"}
    proc = run_python(code, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "refused: attention backend ROCM_FLASH was asked for on Iluvatar" in proc.stdout
    # vLLM logged why (its logger writes to stdout).
    assert "Failed to load general plugin: engine_patch" in proc.stdout + proc.stderr


clean_state = pytest.fixture(ep_helpers.clean_state)
vllm_modules = pytest.fixture(ep_helpers.vllm_modules)


@pytest.mark.long
def test_forward_decode_100k(vllm):
    _, paged = vllm
    case = make_paged_case([102400, 7], 8, 2, 64, 16, torch.float32, seed=16)
    out = paged.forward_decode(*decode_args(case, 102400, 2, 0.125), case.k_scale, case.v_scale)
    assert_close(out, decode_reference(case, 0.125), DECODE_TOL[torch.float32])
