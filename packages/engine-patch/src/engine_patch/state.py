"""What registration did in this process: the single record ``status`` reads.

vLLM loads general plugins in the engine, every worker and the model-registry subprocess, and
may load them several times in one process; everything here is per process and registration
fills it once (see :func:`engine_patch.register`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Optional

from engine_patch.native import NativeOp
from engine_patch.platform import Platform

# Attribute set on every replacement engine-patch installs: the implementation label. Its
# presence on a live symbol is how idempotence and ``status`` tell a patched symbol apart.
MARK = "__engine_patch__"


@dataclass
class PatchRecord:
    """One symbol engine-patch replaced: ``owner.attr`` now holds ``replacement``."""

    target: str
    implementation: str
    reason: str
    owner: Any
    attr: str
    original: Any
    replacement: Any


@dataclass
class PatchState:
    registered: bool = False
    register_calls: int = 0
    platform: Optional[Platform] = None
    vllm_version: Optional[str] = None
    vllm_error: Optional[str] = None
    flavour: Optional[str] = None
    natives: dict[str, NativeOp] = field(default_factory=dict)
    patches: dict[str, PatchRecord] = field(default_factory=dict)
    kept: dict[str, str] = field(default_factory=dict)  # target -> why the native one stays
    triton_guard: list[str] = field(default_factory=list)  # what the guard installed
    triton_refused: list[str] = field(default_factory=list)  # settings it refused
    config_registration: str = "not attempted"
    errors: list[str] = field(default_factory=list)
    linear_ops: dict[str, Any] = field(default_factory=dict)  # target -> linear_ops.LinearOp
    original_forward_decode: Any = None  # vLLM's own, for block-sparse calls and tests


STATE = PatchState()
LOCK = threading.RLock()
