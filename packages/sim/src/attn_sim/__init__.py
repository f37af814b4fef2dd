"""attn-sim: a CPU model of the BI-V100 (and other profiles) over attn-core's plans and code.

Occupancy (:mod:`attn_sim.occupancy`), kernel designs (:mod:`attn_sim.designs`), a meta-tensor
tracer (:mod:`attn_sim.tracer`), the cost model (:mod:`attn_sim.cost`), one simulated step
(:func:`attn_sim.simulate.simulate`), and the commands of ``python -m attn_sim``.
"""

from attn_sim.occupancy import Occupancy, Waves, blocks_per_sm, waves
from attn_sim.simulate import CaseResult, simulate
from attn_sim.tracer import Trace, trace
from attn_sim.workloads import Case

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
