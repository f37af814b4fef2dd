"""Variables (issue 18, class 4): every reader of an ``ATTN_CORE_*`` variable validates it the
same way, and numeric overrides have bounds.

- ``ATTN_CORE_NATIVE_ARCH`` goes through :func:`attn_core.core.settings.parse_archs`, the
  validator ``python -m attn_core.native build --arch`` uses: a value one refuses, the other
  refuses (``status`` and engine-patch read the settings, so they refuse it too);
- integer variables and override fields are bounded above (10^31 used to pass parsing and
  end in an ``OverflowError`` inside engine-patch's self-test);
- a forced partition longer than the step's context is capped at it (a forced 2^24 for a
  100-token step sized gigabytes of scratch).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_core import (
    AttentionShape,
    DecodeLengths,
    DecodeOverrides,
    PrefillOverrides,
    get_device_spec,
    plan_decode,
    profile_capabilities,
)
from attn_core.core import settings as attn_settings
from attn_core.core.settings import ENV_VARS, MAX_TOKENS, Overrides, parse_archs
from attn_core.native import __main__ as native_cli

INT_VARS = [v.name for v in ENV_VARS if v.attr in (
    "partition_size", "single_tile_max", "subscription", "stream_tokens", "budget_bytes",
)]  # fmt: skip
ARCH = "ATTN_CORE_NATIVE_ARCH"
BAD_ARCHS = ["sm90", "SM_90", ",", " , ", "sm_90;ivcore10", "sm_90,,bogus", "ivcore", "90",
             "sm_", "compute_x", "sm_90 sm_80"]  # fmt: skip
GOOD_ARCHS = ["sm_90", "sm_80,sm_90", " sm_90a ", "compute_90", "ivcore10,ivcore11"]


@pytest.mark.parametrize("name", INT_VARS)
@pytest.mark.parametrize("raw", ["1" + "0" * 31, str(2**63), "0", "-4", "1e3", "16.0"])
def test_integer_variables_are_bounded(name: str, raw: str) -> None:
    with pytest.raises(ValueError, match=f"^{name} must be an integer in \\[1, \\d+\\], got"):
        Overrides.from_env({name: raw})


@pytest.mark.parametrize(
    ("cls", "field"),
    [(DecodeOverrides, f) for f in ("partition_size", "single_tile_max", "subscription",
                                     "stream_tokens")]
    + [(PrefillOverrides, f) for f in ("budget_bytes", "query_tile", "key_tile")],
)  # fmt: skip
def test_override_fields_are_bounded(cls, field: str) -> None:
    with pytest.raises(ValueError, match=f"{cls.__name__}.{field} must be None or an int in"):
        cls(**{field: 10**31})


@pytest.mark.parametrize("raw", BAD_ARCHS)
def test_a_bad_arch_variable_is_refused_when_the_settings_are_read(raw: str) -> None:
    with pytest.raises(ValueError, match=f"^{ARCH} must"):
        Overrides.from_env({ARCH: raw})


@given(st.text(alphabet="smcoputeiv_r0129a, ;", max_size=14))
@settings(max_examples=200, deadline=None)
def test_the_variable_and_build_arch_accept_the_same_targets(text: str) -> None:
    """One validator: the settings accept a value exactly when ``build --arch`` does."""

    def verdict(fn):
        try:
            return fn()
        except ValueError:
            return "refused"

    from_env = verdict(lambda: Overrides.from_env({ARCH: text}).native.arch)
    from_cli = verdict(lambda: ",".join(parse_archs("--arch", text)))
    if text.strip() == "":
        assert from_env is None  # unset: the device's target; --arch '' is refused
        return
    assert from_env == from_cli


@pytest.mark.parametrize("raw", GOOD_ARCHS)
def test_good_arch_values_are_kept_normalised(raw: str) -> None:
    arch = Overrides.from_env({ARCH: raw}).native.arch
    assert arch == ",".join(a.strip() for a in raw.split(","))


@pytest.mark.parametrize("command", [["status"], ["build"], ["facts"]])
@pytest.mark.parametrize("raw", ["sm90", ","])
def test_native_cli_refuses_a_bad_arch_variable_naming_it(monkeypatch, capsys, command, raw):
    monkeypatch.setenv(ARCH, raw)
    monkeypatch.setattr(native_cli, "build_all", lambda *a, **k: pytest.fail("a build started"))
    assert native_cli.main(command) == 2
    err = capsys.readouterr().err
    assert ARCH in err and "Traceback" not in err


@pytest.mark.parametrize("forced", [4096, 1 << 20, MAX_TOKENS])
@pytest.mark.parametrize("tier", [None, "partitioned", "one_pass"])
def test_a_forced_partition_longer_than_the_step_is_capped(forced: int, tier) -> None:
    spec = get_device_spec("h200")
    caps = profile_capabilities(spec, torch.float16)
    shape = AttentionShape(24, 4, 256, 16, torch.float16)
    ov = DecodeOverrides(backend="torch", tier=tier, partition_size=forced)
    plan = plan_decode(shape, DecodeLengths(1, 100), spec, caps, ov)
    padded = 128  # 100 tokens + block_size - 1 masked slots, in whole blocks
    assert plan.partition_size <= padded and plan.chunk_tokens <= padded
    small = plan_decode(shape, DecodeLengths(1, 100), spec, caps, DecodeOverrides(
        backend="torch", tier=tier, partition_size=128))  # fmt: skip
    assert plan.workspace_bytes == small.workspace_bytes


def test_reload_with_a_bad_variable_keeps_the_last_good_snapshot(monkeypatch) -> None:
    good = attn_settings.current_overrides()
    monkeypatch.setenv("ATTN_CORE_DECODE_PARTITION_SIZE", "1" + "0" * 31)
    with pytest.raises(ValueError, match="ATTN_CORE_DECODE_PARTITION_SIZE"):
        attn_settings.reload()
    assert attn_settings.current_overrides() is good
