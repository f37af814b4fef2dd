"""The suites' environment variables, parsed one way, with errors that name the variable.

HIL_QUICK takes one boolean grammar everywhere: 1/true/yes/on, 0/false/no/off (any case), empty
or unset = the default; anything else is an error (``HIL_QUICK=true`` once meant "not quick").
The parser is attn_core.core.settings.parse_bool where attn-core is importable (inside the images it
is), else the local copy below with the same semantics, so this file needs neither torch nor
attn-core and the hil tests can check it anywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Optional

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
KINDS = ("decode", "prefill", "hybrid")
DTYPES = ("float16", "bfloat16", "float32")


class SuiteConfigError(ValueError):
    """A bad suite variable or option: the suite reports it as a config error and exits 2."""


def _local_parse_bool(name: str, raw: Optional[str], default: Optional[bool] = False):
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


try:
    from attn_core.core.settings import parse_bool as _parse_bool
except ImportError:  # hil's own tests, a bare interpreter: same grammar, local copy
    _parse_bool = _local_parse_bool


def parse_bool(name: str, raw: Optional[str], default: bool = False) -> bool:
    try:
        return bool(_parse_bool(name, raw, default))
    except ValueError as exc:
        raise SuiteConfigError(str(exc)) from None


def parse_choices(name: str, raw: str, allowed: Sequence[str]) -> list:
    """Comma-separated names from ``allowed``; at least one, no unknown ones."""
    items = [x.strip() for x in raw.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise SuiteConfigError(
            f"{name} must be a comma-separated list from {', '.join(allowed)}, got {raw!r}"
        )
    return items


def parse_dtype(name: str, raw: str) -> Optional[str]:
    """One of DTYPES, or None when empty (the suite picks by device)."""
    text = raw.strip()
    if not text:
        return None
    if text not in DTYPES:
        raise SuiteConfigError(f"{name} must be one of {', '.join(DTYPES)}, got {raw!r}")
    return text


def parse_contexts(name: str, raw: str) -> list:
    """Comma-separated context lengths, each an integer >= 1; [] when empty (all defaults)."""
    out = []
    for item in raw.split(","):
        if not item.strip():
            continue
        try:
            value = int(item.strip())
        except ValueError:
            value = 0
        if value < 1:
            raise SuiteConfigError(
                f"{name} must be comma-separated integers >= 1 (tokens), got {raw!r} "
                f"(bad item {item.strip()!r})"
            )
        out.append(value)
    return out


def quick(environ: Mapping[str, str]) -> bool:
    return parse_bool("HIL_QUICK", environ.get("HIL_QUICK"), False)
