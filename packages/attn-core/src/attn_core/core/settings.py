"""attn-core's environment, read in one place and turned into typed, validated objects.

Nothing else in attn-core reads ``os.environ``, and this module reads it only when a snapshot
is taken: on first use, then on an explicit :func:`reload`. A changed ``ATTN_CORE_*`` variable
therefore takes effect at the next :func:`reload` (engine-patch's CLI and plugin registration
call it when they start), never in the middle of a run. Each snapshot has a generation number;
resolved plans (:mod:`attn_core.runtime.resolve`) are cached per generation, so a reload re-resolves
them and a steady decode step reads no environment at all. Planners, the simulator, the
benchmarks and tests never read the environment: they pass an :class:`Overrides` (or its parts),
or ``backend=`` / ``overrides=`` arguments, explicitly. Precedence everywhere: an explicit
argument, then the environment's snapshot, then the default.

Every variable is one row of :data:`ENV_VARS`; attn-core's README has the same table (a test keeps
the two in step). Booleans use :func:`parse_bool`, the one boolean parser of the repository
(engine-patch and the HIL suites import it): ``1/true/yes/on`` and ``0/false/no/off`` in any
case, empty for the default, anything else a ``ValueError`` naming the variable and the value.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")

DECODE_TIERS = ("single_tile", "one_pass", "partitioned")
DECODE_BACKENDS = ("torch", "native")
DECODE_SCORES = ("fp32", "compute")
GATHER_BYTES = (8, 16)
PREFILL_BACKENDS = ("torch", "sdpa", "vendor_flash", "native")
PREFILL_MMAS = ("wmma", "corex_wmma", "fma")  # the native prefill's matrix-tile variants
SCORE_DTYPES = ("float16", "bfloat16", "float32")


def parse_bool(name: str, raw: Optional[str], default: Optional[bool] = False) -> Optional[bool]:
    """``raw`` (an environment value or None) as a boolean; ``default`` when unset or empty."""
    if raw is None or raw.strip() == "":
        return default
    text = raw.strip().lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    raise ValueError(
        f"{name} must be one of {'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)} "
        f"(empty: the default), got {raw!r}"
    )


# Upper bounds of the numeric overrides. A bound keeps a typo (or 10**31) from reaching the
# planners, where it overflowed a float in the engine-patch self-test or sized
# buffers for it. Tokens: 2**24 = 16 M, 16x the longest context of any model the platform
# serves (1 M); bytes: 2**50 = 1 PiB, beyond any device's memory; the subscription factor
# multiplies the device's thread slots (default 2): 1024 is far past any useful value.
MAX_TOKENS = 1 << 24
MAX_BYTES = 1 << 50
MAX_SUBSCRIPTION = 1024


def parse_int(
    name: str, raw: Optional[str], *, minimum: int = 1, maximum: Optional[int] = None
) -> Optional[int]:
    """``raw`` as an int in ``[minimum, maximum]``; None when unset or empty."""
    if raw is None or raw.strip() == "":
        return None
    bounds = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
    try:
        value = int(raw.strip())
    except ValueError:
        raise ValueError(f"{name} must be an integer {bounds}, got {raw!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be an integer {bounds}, got {raw!r}")
    return value


# Native build targets: sm_XX (SASS), compute_XX (PTX) with an optional "a" (arch-specific
# features), ivcoreNN (Iluvatar CoreX).
_ARCH = re.compile(r"^(sm_\d+a?|compute_\d+a?|ivcore\d+)$")


def parse_archs(name: str, text: str) -> tuple[str, ...]:
    """Comma-separated native build targets (``sm_90``, ``sm_90a``, ``compute_90``,
    ``ivcore10``): the one validator of ``ATTN_CORE_NATIVE_ARCH``, ``python -m
    attn_core.native build --arch`` and ``setup.py``. A ``ValueError`` naming ``name`` (the
    option or variable) for a bad target, and for text that names none (``,``): an empty
    list would mean "every target", a 19-minute build nobody asked for."""
    archs = tuple(a.strip() for a in text.split(",") if a.strip())
    bad = [a for a in archs if not _ARCH.match(a)]
    if bad:
        raise ValueError(
            f"{name} must list targets such as sm_90, compute_90 or ivcore10, got {bad[0]!r}"
        )
    if not archs:
        raise ValueError(f"{name} must name targets such as sm_90 or ivcore10, got {text!r}")
    return archs


def parse_choice(name: str, raw: Optional[str], choices: tuple) -> Optional[Any]:
    """``raw`` as one of ``choices`` (compared as text); None when unset or empty."""
    if raw is None or raw.strip() == "":
        return None
    text = raw.strip()
    for choice in choices:
        if text == str(choice):
            return choice
    raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}, got {raw!r}")


def _check_optional_int(
    owner: str, name: str, value: object, maximum: int, minimum: int = 1
) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ValueError(
            f"{owner}.{name} must be None or an int in [{minimum}, {maximum}], got {value!r}"
        )


def _check_optional_choice(owner: str, name: str, value: object, choices: tuple) -> None:
    # by type as well as value: 1 == True and 8.0 == 8, yet neither is a valid choice
    if value is not None and not any(type(value) is type(c) and value == c for c in choices):
        raise ValueError(f"{owner}.{name} must be None or one of {choices}, got {value!r}")


@dataclass(frozen=True)
class DecodeOverrides:
    """Decode plan decisions forced from outside; None everywhere means "the plan decides".

    Attributes:
        backend: ``"torch"`` or ``"native"`` (the CUDA C++ kernel; raises where it is not
            built or did not match the reference).
        tier: one of :data:`DECODE_TIERS`.
        partition_size: tokens per partition (a multiple of the block size).
        single_tile_max: longest context (tokens) the single_tile tier takes.
        subscription: the even-share subscription factor.
        stream_tokens: turn streaming on with this many tokens per chunk.
        scores: ``"fp32"`` (exact fp32 scores) or ``"compute"`` (scores rounded to the compute
            dtype where bmm cannot write fp32; saves the fp32 key copy).
        gather_bytes: element width of the torch path's block gathers (8 or 16).
    """

    backend: Optional[str] = None
    tier: Optional[str] = None
    partition_size: Optional[int] = None
    single_tile_max: Optional[int] = None
    subscription: Optional[int] = None
    stream_tokens: Optional[int] = None
    scores: Optional[str] = None
    gather_bytes: Optional[int] = None

    def __post_init__(self) -> None:
        owner = "DecodeOverrides"
        _check_optional_choice(owner, "backend", self.backend, DECODE_BACKENDS)
        _check_optional_choice(owner, "tier", self.tier, DECODE_TIERS)
        _check_optional_choice(owner, "scores", self.scores, DECODE_SCORES)
        _check_optional_choice(owner, "gather_bytes", self.gather_bytes, GATHER_BYTES)
        for name in ("partition_size", "single_tile_max", "stream_tokens"):
            _check_optional_int(owner, name, getattr(self, name), MAX_TOKENS)
        _check_optional_int(owner, "subscription", self.subscription, MAX_SUBSCRIPTION)


@dataclass(frozen=True)
class PrefillOverrides:
    """Prefill plan decisions forced from outside; None means "the plan decides".

    Attributes:
        backend: one of :data:`PREFILL_BACKENDS` (a forced fused or native backend that is
            unavailable or fails its reference check raises instead of falling back).
        native_mma: the native kernel's MMA variant (:data:`PREFILL_MMAS`); None: the cheapest
            verified one.
        budget_bytes: bound on transient memory beyond the gathered context.
        stream: True always streams the context, False never; None decides by the budget.
        query_tile / key_tile: tile sizes of the torch backend (tests and sweeps).
        score_dtype: ``"float16"`` / ``"bfloat16"`` / ``"float32"``: the torch backend's score
            and matmul dtype (tests and sweeps; no environment variable).
    """

    backend: Optional[str] = None
    budget_bytes: Optional[int] = None
    stream: Optional[bool] = None
    query_tile: Optional[int] = None
    key_tile: Optional[int] = None
    score_dtype: Optional[str] = None
    native_mma: Optional[str] = None

    def __post_init__(self) -> None:
        owner = "PrefillOverrides"
        _check_optional_choice(owner, "backend", self.backend, PREFILL_BACKENDS)
        _check_optional_choice(owner, "native_mma", self.native_mma, PREFILL_MMAS)
        _check_optional_choice(owner, "stream", self.stream, (True, False))
        _check_optional_choice(owner, "score_dtype", self.score_dtype, SCORE_DTYPES)
        _check_optional_int(owner, "budget_bytes", self.budget_bytes, MAX_BYTES)
        for name in ("query_tile", "key_tile"):
            _check_optional_int(owner, name, getattr(self, name), MAX_TOKENS)


@dataclass(frozen=True)
class NativeSettings:
    """Where and how the native decode kernel is built (see :mod:`attn_core.native`).

    Attributes:
        build: JIT-build the kernel in a source checkout when no prebuilt library is found.
        cuda_home: the CUDA toolkit (nvcc) or CoreX (``/usr/local/corex``, clang) root.
        arch: target architecture (``sm_90``, ``ivcore10``, ...); default: the device's.
        cache_dir: where JIT builds are kept (default ``~/.cache/attn_core``).
    """

    build: bool = True
    cuda_home: Optional[str] = None
    arch: Optional[str] = None
    cache_dir: Optional[str] = None


@dataclass(frozen=True)
class Overrides:
    """Everything attn-core's environment can say, typed and validated.

    Attributes:
        device: a profile name (``bi-v100``, ``h200``, ...) or the path of a profile JSON file
            the plans use instead of the detected device.
        checks: also check tensor *values* (block ids, lengths); reads the device (syncs).
        decode / prefill: plan overrides.
        native: how the native kernel is found or built.
    """

    device: Optional[str] = None
    checks: bool = False
    decode: DecodeOverrides = field(default_factory=DecodeOverrides)
    prefill: PrefillOverrides = field(default_factory=PrefillOverrides)
    native: NativeSettings = field(default_factory=NativeSettings)

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> Overrides:
        """Parse every variable of :data:`ENV_VARS` from ``environ`` (default ``os.environ``)."""
        return _parse(_raw(os.environ if environ is None else environ))


@dataclass(frozen=True)
class EnvVar:
    """One environment variable: where it lands in :class:`Overrides` and how it is parsed."""

    name: str
    section: str  # "" (top level), "decode", "prefill" or "native"
    attr: str
    parse: Callable[[str, Optional[str]], Any]
    default: str  # what happens when it is unset, for the README table
    meaning: str


def _bool_or_none(name: str, raw: Optional[str]) -> Optional[bool]:
    return parse_bool(name, raw, default=None)


def _flag(name: str, raw: Optional[str]) -> bool:
    return bool(parse_bool(name, raw, default=False))


def _flag_on(name: str, raw: Optional[str]) -> bool:
    return bool(parse_bool(name, raw, default=True))


def _tokens(name: str, raw: Optional[str]) -> Optional[int]:
    return parse_int(name, raw, minimum=1, maximum=MAX_TOKENS)


def _bytes(name: str, raw: Optional[str]) -> Optional[int]:
    return parse_int(name, raw, minimum=1, maximum=MAX_BYTES)


def _subscription(name: str, raw: Optional[str]) -> Optional[int]:
    return parse_int(name, raw, minimum=1, maximum=MAX_SUBSCRIPTION)


def _archs(name: str, raw: Optional[str]) -> Optional[str]:
    """Validated targets, comma-joined as given (``sm_90,sm_80``); None when unset or empty."""
    if raw is None or raw.strip() == "":
        return None
    return ",".join(parse_archs(name, raw))


def _text(name: str, raw: Optional[str]) -> Optional[str]:
    return raw.strip() if raw is not None and raw.strip() else None


def _path(name: str, raw: Optional[str]) -> Optional[str]:
    """A path with ``~`` expanded: the shell leaves it as is inside quotes or after ``=``
    (``ATTN_CORE_NATIVE_CACHE='~/c'`` was a directory named ``~`` in the working one)."""
    text = _text(name, raw)
    return os.path.expanduser(text) if text is not None else None


def _choice(choices: tuple) -> Callable[[str, Optional[str]], Any]:
    return lambda name, raw: parse_choice(name, raw, choices)


ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar("ATTN_CORE_DEVICE", "", "device", _path, "detected",
           "device profile the plans use: a name (bi-v100, bi-v100-smem48k, h200, a100) or a "
           "profile JSON file (python -m attn_sim profile-from; ~ expanded)"),
    EnvVar("ATTN_CORE_CHECKS", "", "checks", _flag, "off",
           "also check tensor values (block ids in range, 1 <= seq_lens <= capacity and "
           "max_seq_len, cache-write slots); reads the device, so it syncs"),
    EnvVar("ATTN_CORE_DECODE_BACKEND", "decode", "backend", _choice(DECODE_BACKENDS),
           "native once verified, else torch",
           "force the torch path or the native kernel (raises where native is unusable)"),
    EnvVar("ATTN_CORE_DECODE_TIER", "decode", "tier", _choice(DECODE_TIERS), "plan",
           "force a decode tier"),
    EnvVar("ATTN_CORE_DECODE_PARTITION_SIZE", "decode", "partition_size", _tokens,
           "even-share", "tokens per partition (a multiple of block_size, at most 2^24; one "
           "longer than a step's context is capped at it)"),
    EnvVar("ATTN_CORE_DECODE_SINGLE_TILE_MAX", "decode", "single_tile_max", _tokens,
           "shared-memory fit", "longest context the single_tile tier takes (at most 2^24)"),
    EnvVar("ATTN_CORE_DECODE_SUBSCRIPTION", "decode", "subscription", _subscription, "2",
           "even-share subscription factor (at most 1024)"),
    EnvVar("ATTN_CORE_DECODE_STREAM_TOKENS", "decode", "stream_tokens", _tokens, "off",
           "torch path: stream the context in chunks of this many tokens (bounded workspace; at "
           "most 2^24)"),
    EnvVar("ATTN_CORE_DECODE_SCORES", "decode", "scores", _choice(DECODE_SCORES), "fp32",
           "torch path: compute rounds scores to the compute dtype where bmm cannot write "
           "fp32 (saves the fp32 key copy; vLLM does not round)"),
    EnvVar("ATTN_CORE_DECODE_GATHER_BYTES", "decode", "gather_bytes", _choice(GATHER_BYTES),
           "16", "torch path: element width of the block gathers"),
    EnvVar("ATTN_CORE_PREFILL_BACKEND", "prefill", "backend", _choice(PREFILL_BACKENDS),
           "cheapest verified", "force a prefill backend: torch, sdpa, vendor_flash or native "
           "(raises if unavailable or unverified)"),
    EnvVar("ATTN_CORE_PREFILL_MMA", "prefill", "native_mma", _choice(PREFILL_MMAS),
           "cheapest verified", "native prefill: only this MMA variant (wmma, corex_wmma, fma)"),
    EnvVar("ATTN_CORE_PREFILL_BUDGET_BYTES", "prefill", "budget_bytes", _bytes,
           "1073741824", "prefill transient budget beyond the gathered context (at most 2^50)"),
    EnvVar("ATTN_CORE_PREFILL_STREAM", "prefill", "stream", _bool_or_none, "by budget",
           "on: always stream the prefill context; off: never"),
    EnvVar("ATTN_CORE_NATIVE_BUILD", "native", "build", _flag_on, "on",
           "JIT-build the native kernel in a source checkout when no prebuilt one is found"),
    EnvVar("ATTN_CORE_NATIVE_ARCH", "native", "arch", _archs, "the device's",
           "targets of native builds, comma-separated (sm_90, compute_90, ivcore10, ...)"),
    EnvVar("ATTN_CORE_NATIVE_CACHE", "native", "cache_dir", _path, "~/.cache/attn_core",
           "directory of JIT-built native kernels (~ expanded)"),
    EnvVar("CUDA_HOME", "native", "cuda_home", _path, "CUDA_PATH, then /usr/local/cuda",
           "toolkit root for native builds (/usr/local/corex on Iluvatar; ~ expanded)"),
)  # fmt: skip


def env_var_table() -> str:
    """:data:`ENV_VARS` as attn-core's README shows them (a test holds the README to it)."""
    rows = ["| variable | default | effect |", "|---|---|---|"]
    rows += [f"| `{v.name}` | {v.default} | {v.meaning} |" for v in ENV_VARS]
    return "\n".join(rows)


_CUDA_PATH = "CUDA_PATH"  # CUDA_HOME's fallback (Windows-style installs, some containers)


def _raw(environ: Mapping[str, str]) -> tuple[Optional[str], ...]:
    return tuple(environ.get(v.name) for v in ENV_VARS) + (environ.get(_CUDA_PATH),)


@functools.lru_cache(maxsize=32)
def _parse(raw: tuple[Optional[str], ...]) -> Overrides:
    sections: dict[str, dict[str, Any]] = {"": {}, "decode": {}, "prefill": {}, "native": {}}
    for var, value in zip(ENV_VARS, raw[: len(ENV_VARS)], strict=True):
        sections[var.section][var.attr] = var.parse(var.name, value)
    if sections["native"]["cuda_home"] is None:
        sections["native"]["cuda_home"] = _path(_CUDA_PATH, raw[-1])
    return Overrides(
        decode=DecodeOverrides(**sections["decode"]),
        prefill=PrefillOverrides(**sections["prefill"]),
        native=NativeSettings(**sections["native"]),
        **sections[""],
    )


_SNAPSHOT: list = []  # [(generation, Overrides)]: replaced whole, so readers need no lock


def reload() -> Overrides:
    """Read the environment again (the one time it is read after the first use) and start a new
    settings generation: plans resolved under the old one are resolved again on their next use."""
    generation = _SNAPSHOT[0][0] + 1 if _SNAPSHOT else 1
    snapshot = (generation, Overrides.from_env())
    _SNAPSHOT[:] = [snapshot]
    return snapshot[1]


def current_overrides() -> Overrides:
    """The settings snapshot (the environment as of the first use or the last :func:`reload`)."""
    if not _SNAPSHOT:
        return reload()
    return _SNAPSHOT[0][1]


def generation() -> int:
    """The snapshot's generation: a part of every resolved plan's cache key."""
    if not _SNAPSHOT:
        reload()
    return int(_SNAPSHOT[0][0])
