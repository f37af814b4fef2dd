"""How ``engine-patch`` ends: its exit codes, one table for ``--help``, the README and the report.

2 covers both what argparse cannot parse and what parses but is invalid (an argument, an
``ENGINE_PATCH_*`` or ``ATTN_CORE_*`` value, a device or a package the command needs that this
machine lacks): either way the input is at fault, not the device, so a caller can tell "fix the
command" (2) from "the numbers are wrong" (1). attn_sim and hil use 2 the same way.
"""

from __future__ import annotations

import textwrap

EXIT_OK = 0
EXIT_SELF_TEST = 1
EXIT_CONFIG = 2
EXIT_INACTIVE = 3
EXIT_TRITON = 4
EXIT_INTERNAL = 5

MEANINGS = {
    EXIT_OK: "OK (also when vLLM is not installed: attn-core is then checked directly)",
    EXIT_SELF_TEST: "a self-test did not match the float64 reference on this device",
    EXIT_CONFIG: "configuration error: a bad argument or ENGINE_PATCH_* / ATTN_CORE_* value, "
    "or a device or package the command needs is missing (the message names which)",
    EXIT_INACTIVE: "vLLM is present but the engine-patch plugin is not active in this process",
    EXIT_TRITON: "on Iluvatar a setting asks for Triton attention",
    EXIT_INTERNAL: "internal error: engine-patch itself failed (a bug; the message says where)",
}


class ConfigurationError(ValueError):
    """Input the command cannot run with; ``str()`` names the argument or variable, the expected
    and the actual value. Exit :data:`EXIT_CONFIG`."""


def help_text() -> str:
    """The exit-code table for ``--help``."""
    rows = (
        textwrap.fill(text, 88, initial_indent=f"  {code}  ", subsequent_indent="     ")
        for code, text in MEANINGS.items()
    )
    return "exit codes:\n" + "\n".join(rows)
