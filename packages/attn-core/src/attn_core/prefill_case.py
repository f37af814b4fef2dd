"""Random chunked-prefill problems; the code lives in :mod:`attn_core.testing.prefill_case`.

Kept as an import path for the bench and older callers.
"""

from attn_core.testing.prefill_case import PrefillArgs, PrefillCase, make_prefill_case

__all__ = ["PrefillArgs", "PrefillCase", "make_prefill_case"]
