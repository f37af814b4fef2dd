"""Registration: find what the platform has, install the replacements, record everything.

Idempotent by construction: every replacement carries :data:`engine_patch.state.MARK`, a
symbol that already carries it is left alone, and the process-wide :data:`STATE` remembers what
was done. vLLM may call the plugin several times per process (engine, worker, model registry);
the second and later calls change nothing.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import logging
import sys
from collections.abc import Callable
from typing import Any

import attn_core.core.settings
from engine_patch import hooks, linear_ops, settings, triton_guard
from engine_patch.native import TORCH_OPS, probe
from engine_patch.ops import REPLACEMENTS
from engine_patch.platform import detect_platform
from engine_patch.qwen3_5_moe import register_qwen3_5_moe
from engine_patch.signatures import UPSTREAM
from engine_patch.state import LOCK, MARK, STATE, PatchRecord, PatchState

logger = logging.getLogger("engine_patch")
ORIGINAL = "__engine_patch_original__"


def _live(owner: Any, attr: str) -> Any:
    # getattr_static: follow a class's MRO without unwrapping the staticmethod descriptor.
    value = inspect.getattr_static(owner, attr, None)
    return value.__func__ if isinstance(value, staticmethod) else value


def implementation_of(owner: Any, attr: str) -> str:
    """What ``owner.attr`` runs now: engine-patch's label, or the function's own name."""
    value = _live(owner, attr)
    label = getattr(value, MARK, None)
    if label is not None:
        return label
    if value is None:
        return "missing"
    return f"original: {getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', value)}"


def apply_patch(
    owner: Any,
    attr: str,
    replacement: Callable,
    *,
    target: str,
    implementation: str,
    reason: str,
    static: bool = False,
) -> PatchRecord:
    """Install ``replacement`` as ``owner.attr`` unless engine-patch already did."""
    current = _live(owner, attr)
    if getattr(current, MARK, None) is not None and target in STATE.patches:
        return STATE.patches[target]
    original = getattr(current, ORIGINAL, current)
    setattr(replacement, MARK, implementation)
    setattr(replacement, ORIGINAL, original)
    setattr(owner, attr, staticmethod(replacement) if static else replacement)
    record = PatchRecord(target, implementation, reason, owner, attr, original, replacement)
    STATE.patches[target] = record
    return record


def _unpatched(owner: Any, attr: str) -> Any:
    current = _live(owner, attr)
    return getattr(current, ORIGINAL, current)


def _patch_custom_ops(ops: Any) -> None:
    class _Originals:  # probe the original functions even if a patch is already in place
        pass

    for name in TORCH_OPS:
        if getattr(ops, name, None) is not None:
            setattr(_Originals, name, staticmethod(_unpatched(ops, name)))
    natives = {name: probe(name, _Originals) for name in TORCH_OPS}
    v1 = natives["paged_attention_v1"]
    STATE.flavour = v1.flavour or UPSTREAM
    STATE.natives = natives
    force = settings.force_enabled()
    for name, native in natives.items():
        replacement = REPLACEMENTS[(name, native.flavour or STATE.flavour)]
        target = f"vllm._custom_ops.{name}"
        if native.present and not force:
            op = hooks.native_with_fallback(native, replacement)
            label = f"native {native.detail} (attn-core after NotImplementedError)"
            STATE.kept[target] = native.detail
            apply_patch(ops, name, op, target=target, implementation=label, reason="native present")
        else:
            why = f"{settings.FORCE_ENV}=1" if force and native.present else native.detail
            wrapper = _fresh(replacement)
            label = f"attn-core ({replacement.__name__})"
            apply_patch(ops, name, wrapper, target=target, implementation=label, reason=why)


def _fresh(fn: Callable) -> Callable:
    """A distinct function object per install, so marks never leak between targets."""

    def op(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return functools.wraps(fn)(op)


def _patch_paged_attention(paged_attn: Any) -> None:
    cls = paged_attn.PagedAttention
    decode = _unpatched(cls, "forward_decode")
    prefix = _unpatched(cls, "forward_prefix")
    STATE.original_forward_decode = decode
    apply_patch(
        cls,
        "forward_decode",
        hooks.make_forward_decode(decode),
        target="PagedAttention.forward_decode",
        implementation="engine-patch route: native V1 within its reach, attn-core plan beyond",
        reason="vLLM's V1/V2 heuristic replaced by attn-core's plan",
        static=True,
    )
    if prefix is None:  # a build without the prefix path: nothing can call it
        STATE.kept["PagedAttention.forward_prefix"] = "absent in this vLLM"
        return
    apply_patch(
        cls,
        "forward_prefix",
        hooks.make_forward_prefix(prefix),
        target="PagedAttention.forward_prefix",
        implementation="attn-core paged_prefix_prefill (no Triton)",
        reason="vLLM's Triton context_attention_fwd hangs Iluvatar",
        static=True,
    )


def _install_triton_guard(paged_attn: Any) -> None:
    refuse = triton_guard.refusing_context_attention_fwd
    installed = []
    holders = [(paged_attn, "context_attention_fwd")]
    prefix_module = sys.modules.get("vllm.attention.ops.prefix_prefill")
    if prefix_module is not None:
        holders.append((prefix_module, "context_attention_fwd"))
    for module, attr in holders:
        if getattr(module, attr, None) is not None:
            target = f"{module.__name__}.{attr}"
            apply_patch(
                module,
                attr,
                _fresh(refuse),
                target=target,
                implementation="refused (Triton on Iluvatar)",
                reason=triton_guard.EXPLANATION,
            )
            installed.append(target)
    selector = importlib.import_module("vllm.attention.selector")
    which = _unpatched(selector, "which_attn_to_use")
    apply_patch(
        selector,
        "which_attn_to_use",
        triton_guard.guard_which_attn_to_use(which),
        target="vllm.attention.selector.which_attn_to_use",
        implementation="vLLM's selector, Triton backends refused",
        reason=triton_guard.EXPLANATION,
    )
    installed.append("vllm.attention.selector.which_attn_to_use")
    get_backend = _unpatched(selector, "get_attn_backend")
    guarded = triton_guard.guard_get_attn_backend(get_backend)
    holders = [(selector, "get_attn_backend")] + triton_guard.modules_holding(get_backend)
    for module, attr in holders:
        target = f"{module.__name__}.{attr}"
        apply_patch(
            module,
            attr,
            guarded,
            target=target,
            implementation="vLLM's get_attn_backend, block-sparse (Triton) refused",
            reason=triton_guard.EXPLANATION,
        )
        installed.append(target)
    if hasattr(get_backend, "cache_clear"):
        get_backend.cache_clear()  # a backend chosen before the guard must be chosen again
    STATE.triton_guard = sorted(set(installed))


def _patch_vllm() -> None:
    try:
        ops = importlib.import_module("vllm._custom_ops")
        paged_attn = importlib.import_module("vllm.attention.ops.paged_attn")
    except ImportError as exc:
        # Absent is a normal state (every machine but the lab's): information, not an error.
        # Installed but failing to import is an error worth showing.
        if vllm_installed():
            STATE.vllm_error = f"vllm is installed but not importable: {exc}"
        return
    STATE.vllm_version = _vllm_version()
    # The guard first: should a setting below be refused (ENGINE_PATCH_FORCE=maybe raises),
    # vLLM logs the error and runs on - without attn-core's routes, but never into Triton.
    if STATE.platform is not None and STATE.platform.is_iluvatar:
        _install_triton_guard(paged_attn)
        STATE.triton_refused = triton_guard.refused_settings()
    _patch_custom_ops(ops)
    _patch_paged_attention(paged_attn)


def _vllm_version() -> str:
    try:
        from importlib.metadata import version

        return version("vllm")
    except Exception:
        return str(getattr(sys.modules.get("vllm"), "__version__", "unknown"))


def vllm_installed() -> bool:
    """Whether a ``vllm`` package is there to import (importable or not)."""
    try:
        return importlib.util.find_spec("vllm") is not None
    except ValueError:  # a module object without __spec__ stands in for vllm: it is "there"
        return True


def vllm_importable() -> bool:
    try:
        importlib.import_module("vllm.attention.ops.paged_attn")
    except ImportError:
        return False
    return True


def register() -> PatchState:
    """The ``vllm.general_plugins`` entry point: route vLLM's attention to attn-core.

    Safe to call any number of times in one process. Raises
    :class:`engine_patch.triton_guard.TritonRefusedError` on Iluvatar when the configuration
    asks for Triton attention (after installing every guard), and
    :class:`engine_patch.signatures.UnknownSignatureError` for an unknown vLLM convention.
    """
    with LOCK:
        STATE.register_calls += 1
        if not (STATE.registered and is_active()):
            attn_core.core.settings.reload()  # the process's ATTN_CORE_* as of registration
            STATE.platform = detect_platform()
            STATE.config_registration = register_qwen3_5_moe()
            try:
                linear_ops.install()
                _patch_vllm()
            except Exception as exc:
                STATE.errors.append(f"{type(exc).__name__}: {exc}")
                raise
            STATE.registered = True
            logger.info("engine-patch registered: %d symbols patched", len(STATE.patches))
        if STATE.triton_refused:
            raise triton_guard.TritonRefusedError(
                f"refused on Iluvatar: {', '.join(STATE.triton_refused)}: "
                f"{triton_guard.EXPLANATION}"
            )
    return STATE


def is_active() -> bool:
    """Whether vLLM's ``PagedAttention`` in this process runs engine-patch's routes."""
    paged_attn = sys.modules.get("vllm.attention.ops.paged_attn")
    if paged_attn is None:
        return False
    cls = paged_attn.PagedAttention
    decode, prefix = _live(cls, "forward_decode"), _live(cls, "forward_prefix")
    return getattr(decode, MARK, None) is not None and (
        prefix is None or getattr(prefix, MARK, None) is not None
    )
