"""The hybrid model's linear-attention ops, served by attn-core wherever the serving code has
them, by name.

:data:`TARGETS` lists ``(module, attribute, convention)``; ``ENGINE_PATCH_LINEAR_OPS`` adds to
it (:func:`engine_patch.settings.linear_ops_extra`). :func:`install` replaces every target whose
module is loaded and whose signature an adapter matches (:mod:`engine_patch.linear_adapters`),
and the other loaded modules that imported the same function by name; :class:`_Finder` does the
same for a target module imported later. No module is imported to look for a target: importing
flash-linear-attention or vLLM's FLA copy would import Triton.

On Iluvatar a Triton kernel hangs the GPU for good, so a Triton-backed target that cannot be
matched is replaced by a function raising :class:`~engine_patch.triton_guard.TritonRefusedError`
with the reason: never left untouched; so is every other Triton entry point of the family in
:data:`GUARDED_PACKAGES`, listed or not.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import re
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

from engine_patch import linear_adapters, settings, state_layout, triton_guard
from engine_patch.state import LOCK, MARK, STATE

logger = logging.getLogger("engine_patch")

_VLLM_FLA = "vllm.model_executor.layers.fla.ops"
_HF_NEXT = "transformers.models.qwen3_next.modeling_qwen3_next"
_HF_35 = "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe"
_CONV = "vllm.model_executor.layers.mamba.ops.causal_conv1d"
TARGETS: tuple[tuple[str, str, str], ...] = (
    ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule", "chunk_gated_delta_rule"),
    ("fla.ops.gated_delta_rule", "fused_recurrent_gated_delta_rule",
     "fused_recurrent_gated_delta_rule"),
    ("fla.ops.gated_delta_rule.chunk", "chunk_gated_delta_rule", "chunk_gated_delta_rule"),
    ("fla.ops.gated_delta_rule.fused_recurrent", "fused_recurrent_gated_delta_rule",
     "fused_recurrent_gated_delta_rule"),
    (_VLLM_FLA, "chunk_gated_delta_rule", "chunk_gated_delta_rule"),
    (_VLLM_FLA, "fused_recurrent_gated_delta_rule", "vllm_fused_recurrent_gated_delta_rule"),
    (_VLLM_FLA + ".chunk", "chunk_gated_delta_rule", "chunk_gated_delta_rule"),
    (_VLLM_FLA + ".fused_recurrent", "fused_recurrent_gated_delta_rule",
     "vllm_fused_recurrent_gated_delta_rule"),
    (_VLLM_FLA, "fused_sigmoid_gating_delta_rule_update",
     "vllm_fused_sigmoid_gating_delta_rule_update"),
    (_VLLM_FLA + ".fused_sigmoid_gating", "fused_sigmoid_gating_delta_rule_update",
     "vllm_fused_sigmoid_gating_delta_rule_update"),
    (_CONV, "causal_conv1d_fn", "causal_conv1d_fn"),
    (_CONV, "causal_conv1d_update", "causal_conv1d_update"),
    ("vllm.model_executor.models.qwen3_next", "fused_gdn_gating", "vllm_fused_gdn_gating"),
    ("vllm.model_executor.layers.mamba.gdn_linear_attn", "fused_gdn_gating",
     "vllm_fused_gdn_gating"),
    ("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn", "fused_gdn_gating",
     "vllm_fused_gdn_gating"),
    (_HF_NEXT, "torch_chunk_gated_delta_rule", "torch_chunk_gated_delta_rule"),
    (_HF_NEXT, "torch_recurrent_gated_delta_rule", "torch_recurrent_gated_delta_rule"),
    (_HF_35, "torch_chunk_gated_delta_rule", "torch_chunk_gated_delta_rule"),
    (_HF_35, "torch_recurrent_gated_delta_rule", "torch_recurrent_gated_delta_rule"),
)  # fmt: skip
# Loaded modules under these packages are searched for other names bound to a target function.
HOLDER_PREFIXES = ("vllm", "fla", "transformers")
# On Iluvatar every Triton entry point of the family in these packages is refused unless a
# target serves it, listed or not: a kernel a later release adds (vLLM's packed decode, say)
# fails naming itself instead of hanging the GPU. "Entry point": a public function defined in
# the module, named for the family, in a module that uses Triton.
GUARDED_PACKAGES = (
    "fla.ops",
    "vllm.model_executor.layers.fla.ops",
    "vllm.model_executor.layers.mamba.ops",
)
FAMILY_NAME = re.compile(r"delta_rule|causal_conv1d|gdn|gated_delta")
UNLISTED = "no attn-core convention is listed for it (ENGINE_PATCH_LINEAR_OPS adds one)"
SERVED, UNMATCHED, REFUSED = "attn-core", "untouched", "refused"


@dataclass
class LinearOp:
    """One target found: what serves it now and why."""

    target: str
    convention: str
    triton: bool
    serves: str  # SERVED, UNMATCHED or REFUSED
    reason: str
    holders: tuple[str, ...] = ()


def targets(environ: Optional[Any] = None) -> list[tuple[str, str, str]]:
    """:data:`TARGETS` and ``ENGINE_PATCH_LINEAR_OPS``'s, without repeats."""
    seen: list[tuple[str, str, str]] = []
    for item in (*TARGETS, *settings.linear_ops_extra(environ)):
        if item not in seen:
            seen.append(item)
    return seen


def is_triton(fn: Any) -> bool:
    """Whether ``fn``'s defining module uses Triton (imports it, or holds a Triton kernel)."""
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    if module is None:
        return False
    for value in list(vars(module).values()):
        if isinstance(value, types.ModuleType):
            name = value.__name__
        else:
            name = type(value).__module__ or ""
        if name.split(".")[0] == "triton" or name.startswith("vllm.triton_utils"):
            return True
    return False


def _refusal(target: str) -> Callable[[str], Any]:
    def refuse(why: str) -> Any:
        raise triton_guard.TritonRefusedError(
            f"{target} is a Triton kernel and attn-core cannot take its place ({why}): "
            f"{triton_guard.EXPLANATION}"
        )

    return refuse


def _refuser(target: str, why: str) -> Callable:
    refuse = _refusal(target)

    def refused(*args: Any, **kwargs: Any) -> Any:
        return refuse(why)

    return refused


def _holders(original: Any, module: types.ModuleType, attr: str) -> list[tuple[Any, str]]:
    found = []
    for prefix in HOLDER_PREFIXES:
        for holder, name in triton_guard.modules_holding(original, prefix):
            if (holder, name) != (module, attr):
                found.append((holder, name))
    return found


def _install_one(module: types.ModuleType, attr: str, convention_name: str) -> None:
    from engine_patch.registration import ORIGINAL, apply_patch

    target = f"{module.__name__}.{attr}"
    current = getattr(module, attr, None)
    if current is None:
        return
    if getattr(current, MARK, None) is not None and target in STATE.linear_ops:
        return
    original = getattr(current, ORIGINAL, current)
    convention = linear_adapters.CONVENTIONS[convention_name]
    triton = is_triton(original)
    why = linear_adapters.match(original, convention)
    iluvatar = STATE.platform is not None and STATE.platform.is_iluvatar
    if why is None:
        refuse = _refusal(target) if triton and iluvatar else None
        home = getattr(original, "__module__", None) or module.__name__
        make: Callable[[], Callable] = lambda: linear_adapters.make_adapter(  # noqa: E731
            original, convention, refuse, lambda: state_layout.layout_for(home)
        )
        label = f"attn-core {convention.attn_core_name} ({convention_name} convention)"
        serves, reason = SERVED, f"matched the {convention_name} convention"
        if convention.state is not None:
            layout, how = state_layout.layout_for(home)
            reason += f"; states {layout or 'layout unknown until the first call'} ({how})"
    elif triton and iluvatar:
        make = lambda: _refuser(target, why)  # noqa: E731
        label, serves, reason = "refused (Triton on Iluvatar)", REFUSED, why
        logger.error("engine-patch: %s refused on Iluvatar: %s", target, why)
    else:
        STATE.linear_ops[target] = LinearOp(target, convention_name, triton, UNMATCHED, why)
        return
    holders = [(module, attr)] + _holders(original, module, attr)
    for owner, name in holders:
        where = f"{owner.__name__}.{name}"
        apply_patch(owner, name, make(), target=where, implementation=label, reason=reason)
    names = tuple(f"{o.__name__}.{n}" for o, n in holders[1:])
    STATE.linear_ops[target] = LinearOp(target, convention_name, triton, serves, reason, names)


def _on_iluvatar() -> bool:
    return STATE.platform is not None and STATE.platform.is_iluvatar


def guarded(module_name: str) -> bool:
    return any(module_name == p or module_name.startswith(p + ".") for p in GUARDED_PACKAGES)


def _guard_unlisted(module: types.ModuleType) -> None:
    """On Iluvatar, refuse each Triton entry point of the family in ``module`` that no target
    serves (and the other loaded names bound to it)."""
    if not (_on_iluvatar() and guarded(module.__name__)):
        return
    from engine_patch.registration import apply_patch

    for attr, value in list(vars(module).items()):
        target = f"{module.__name__}.{attr}"
        if (
            not isinstance(value, types.FunctionType)
            or value.__module__ != module.__name__
            or attr.startswith("_")
            or not FAMILY_NAME.search(attr)
            or target in STATE.linear_ops
            or getattr(value, MARK, None) is not None
            or not is_triton(value)
        ):
            continue
        holders = [(module, attr)] + _holders(value, module, attr)
        for owner, name in holders:
            apply_patch(owner, name, _refuser(target, UNLISTED), target=f"{owner.__name__}.{name}",
                        implementation="refused (Triton on Iluvatar)", reason=UNLISTED)  # fmt: skip
        names = tuple(f"{o.__name__}.{n}" for o, n in holders[1:])
        STATE.linear_ops[target] = LinearOp(target, "-", True, REFUSED, UNLISTED, names)
        logger.error("engine-patch: %s refused on Iluvatar: %s", target, UNLISTED)


def install(environ: Optional[Any] = None) -> None:
    """Replace every target in a loaded module, and on Iluvatar refuse the family's unlisted
    Triton entry points; hook the modules not loaded yet (idempotent)."""
    with LOCK:
        wanted = targets(environ)
        for module_name, attr, convention in wanted:
            module = sys.modules.get(module_name)
            if module is not None:
                _install_one(module, attr, convention)
        for name, module in list(sys.modules.items()):
            if module is not None and guarded(name):
                _guard_unlisted(module)
        finder = next((f for f in sys.meta_path if isinstance(f, _Finder)), None)
        if finder is None:
            finder = _Finder()
            sys.meta_path.insert(0, finder)
        finder.wanted = wanted


class _Finder(importlib.abc.MetaPathFinder):
    """Patches a target module right after it executes (the import machinery's own loader runs
    it; this finder only wraps ``exec_module``)."""

    def __init__(self) -> None:
        self.wanted: list[tuple[str, str, str]] = []
        self._busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        attrs = [(a, c) for m, a, c in self.wanted if m == fullname]
        if not (attrs or (_on_iluvatar() and guarded(fullname))) or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            run(module)
            with LOCK:
                for attr, convention in attrs:
                    _install_one(module, attr, convention)
                _guard_unlisted(module)

        wrapper = _WrappedLoader(loader, exec_module)
        spec.loader = wrapper
        return spec


class _WrappedLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, exec_module: Callable) -> None:
        self._loader = loader
        self.exec_module = exec_module  # type: ignore[method-assign]

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
