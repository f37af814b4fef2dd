"""The CPU threads the float64 reference may use when test workers run side by side.

The reference runs on the CPU, one small torch op after another. Under pytest-xdist every
worker's torch defaults to every core: 14 workers on a 16-core GPU host ran 224 threads, and one
reference at the model's linear-attention dims (393 tokens, 32 heads of 128 x 128) did not
finish in 250 s there (H100 host); engine-patch's self-test references missed 120 s the same way.
"""

from __future__ import annotations

import os

import torch


def share_cores_among_workers() -> None:
    """Give this process its share of the cores when pytest-xdist runs ``N > 1`` workers
    (``PYTEST_XDIST_WORKER_COUNT``); otherwise leave torch's thread count alone."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
