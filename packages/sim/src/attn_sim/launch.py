"""The entry point of ``python -m attn_sim`` and the ``attn-sim`` script: :func:`attn_sim.cli.main`
once its dependencies import, else one line naming the missing package and how to install it
(exit 2, as every input this command cannot run with), never a ModuleNotFoundError traceback."""

from __future__ import annotations

import sys
from typing import Optional

# What to install for each dependency the command imports (packages/sim/pyproject.toml).
INSTALL = {
    "torch": "pip install torch (a CPU build is enough for the simulator)",
    "tabulate": "pip install tabulate",
    "matplotlib": "pip install matplotlib",
    "attn_core": "pip install -e packages/attn-core",
}
EXIT_BAD_INPUT = 2


def main(argv: Optional[list] = None) -> int:
    try:
        from attn_sim.cli import main as run
    except ModuleNotFoundError as err:
        top = (err.name or "").split(".")[0]
        how = INSTALL.get(top, f"pip install {top}" if top else "pip install -e packages/sim")
        print(
            f"python -m attn_sim: error: needs the package {top or err.name!r}, which is not "
            f"importable in {sys.executable} ({how})",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    return run(argv)
