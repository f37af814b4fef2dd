"""Calling conventions are read off parameter names; unknown ones are refused by name."""

import functools

import pytest

from engine_patch.signatures import KNOWN, UPSTREAM, VENDOR, UnknownSignatureError, flavour_of


def _fn(names):
    namespace = {}
    exec(f"def f({', '.join(names)}): pass", namespace)
    return namespace["f"]


@pytest.mark.parametrize("op", sorted(KNOWN))
@pytest.mark.parametrize("flavour", [UPSTREAM, VENDOR])
def test_known_conventions(op, flavour):
    assert flavour_of(op, _fn(KNOWN[op][flavour])) == flavour


def test_wrapped_function_is_read_through_the_wrapper():
    # vLLM 0.6.3 wraps every _custom_ops function in hint_on_error (functools.wraps).
    inner = _fn(KNOWN["paged_attention_v1"][UPSTREAM])

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        return inner(*args, **kwargs)

    assert flavour_of("paged_attention_v1", wrapper) == UPSTREAM


def test_v2_scratch_names_may_differ():
    names = ("output", "exp_sums", "max_logits", "tmp_output") + KNOWN["paged_attention_v2"][
        VENDOR
    ][4:]
    assert flavour_of("paged_attention_v2", _fn(names)) == VENDOR


def test_unknown_signature_is_refused_with_names():
    names = ("out", "query", "key_cache", "value_cache", "kv_head_ids", "scale")
    with pytest.raises(UnknownSignatureError) as info:
        flavour_of("paged_attention_v1", _fn(names))
    text = str(info.value)
    assert "_custom_ops.paged_attention_v1" in text
    assert "kv_head_ids" in text and "head_mapping" in text and "num_kv_heads" in text
    assert isinstance(info.value, ValueError)
