"""The hybrid model's linear-attention layers (Gated DeltaNet) in portable PyTorch.

Read top-down as the data flows: :mod:`.inputs` (validation), :mod:`.plan` (chunk and segment
sizes, a pure function of shapes), :mod:`.chunked` (prefill in 64-token chunks),
:mod:`.recurrent` (one token at a time; decode), :mod:`.conv` (the short causal convolution),
:mod:`.gates` (the per-token gates from the layer's projections)
and :mod:`.api` (the flash-linear-attention / vLLM compatible entry points). A native backend
plugs in at :mod:`.api`: the executors take validated inputs and a plan, nothing else.
"""
