"""The report's time-to-first-token table: attn-core's plans and cost function over a whole
prompt, torch vs native, on bi-v100 and h200."""

from __future__ import annotations

import pytest

from attn_core.prefill.cost import EFFICIENCY
from attn_sim.designs import QWEN36
from attn_sim.prefill_ttft import CHUNKS, PROMPTS, prompt_seconds, rate_rows, ttft_rows
from attn_sim.profiles import load_profile

SPECS = [load_profile("bi-v100"), load_profile("h200")]


@pytest.fixture(scope="module")
def rows():
    return ttft_rows(QWEN36, SPECS)


def test_a_row_per_profile_prompt_and_chunk(rows) -> None:
    assert len(rows) == len(SPECS) * len(PROMPTS) * len(CHUNKS)
    assert {r["matrix_variant"] for r in rows if r["profile"] == "bi-v100"} == {"corex_wmma"}
    assert {r["matrix_variant"] for r in rows if r["profile"] == "h200"} == {"wmma"}


def test_longer_prompts_cost_more_and_the_plan_is_never_dearer(rows) -> None:
    for profile in ("bi-v100", "h200"):
        for chunk in ("2K", "8K"):
            mine = [r for r in rows if r["profile"] == profile and r["chunk"] == chunk]
            for key in ("torch_s", "native_matrix_s", "native_fma_s", "plan_s"):
                values = [r[key] for r in mine]
                assert values == sorted(values) and values[0] > 0, (profile, chunk, key)
            assert all(r["plan_s"] <= r["torch_s"] for r in mine)


def test_chunks_add_up_to_the_prompt() -> None:
    """The whole prompt is planned: 8 chunks of 2K for a 16K prompt, each priced once."""
    s = prompt_seconds(QWEN36, SPECS[1], 16 * 1024, 2 * 1024)
    assert sum(s["picked"].values()) == 8
    assert s["plan"] <= min(s["torch"], *(s[f"native:{v}"] for v in ("wmma", "fma"))) + 1e-12


def test_rates_carry_their_provenance() -> None:
    rows = rate_rows(SPECS)
    bi = next(r for r in rows if r["what"] == "bi-v100 fp16_flops")
    assert bi["provenance"].startswith("datasheet")
    assert {r["what"].split()[1] for r in rows if r["what"].startswith("efficiency")} == set(
        EFFICIENCY
    )


def test_each_profile_is_priced_only_with_variants_its_vendor_runs(rows) -> None:
    """``native:wmma`` is NVIDIA's (nvcc's wmma): a bi-v100 plan may pick CoreX's matrix
    variant or fma, never it; an NVIDIA profile never picks ``corex_wmma``."""
    for r in rows:
        picks = r["plan_picks"]
        if r["profile"] == "bi-v100":
            assert "native:wmma" not in picks, r
        else:
            assert "native:corex_wmma" not in picks, r
    s = prompt_seconds(QWEN36, SPECS[0], 16 * 1024, 2 * 1024)
    assert "native:wmma" not in s and "native:corex_wmma" in s
