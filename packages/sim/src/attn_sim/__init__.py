"""attn-sim: a CPU model of the BI-V100 (and other profiles) over attn-core's plans and code.

Occupancy (:mod:`attn_sim.occupancy`), kernel designs (:mod:`attn_sim.designs`), a meta-tensor
tracer (:mod:`attn_sim.tracer`), the cost model (:mod:`attn_sim.cost`), one simulated step
(:func:`attn_sim.simulate.simulate`), and the commands of ``python -m attn_sim``.
"""

import importlib
from typing import Any

# Imported on first use, not here: `python -m attn_sim` imports this package before its entry
# point can say, in one line, that torch (which these modules need) is missing.
_LAZY = {
    "Occupancy": "occupancy",
    "Waves": "occupancy",
    "blocks_per_sm": "occupancy",
    "waves": "occupancy",
    "CaseResult": "simulate",
    "simulate": "simulate",
    "Trace": "tracer",
    "trace": "tracer",
    "Case": "workloads",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'attn_sim' has no attribute {name!r}")
    return getattr(importlib.import_module(f"attn_sim.{_LAZY[name]}"), name)


__all__ = [
    "Case",
    "CaseResult",
    "Occupancy",
    "Trace",
    "Waves",
    "blocks_per_sm",
    "simulate",
    "trace",
    "waves",
]
