"""Shared foundations every other folder builds on; imports nothing of attn-core outside it.

- :mod:`.settings`: the one reader of the environment (a snapshot, :func:`~.settings.reload`),
  typed overrides, the boolean parser of the repository;
- :mod:`.checks`: argument checks whose errors name the argument, expected and actual;
- :mod:`.shapes`, :mod:`.cache_layout`: attention shapes and vLLM 0.6.3's paged-cache layout;
  :mod:`.cache_write`: ``write_to_paged_cache``;
- :mod:`.workspace`: reusable per-thread scratch, CUDA-graph capture detection;
- :mod:`.lse_merge`: the fp32 log-sum-exp merge of partial outputs;
- :mod:`.plan_types`: :class:`~.plan_types.KernelStep`, the launch record plans carry;
- :mod:`.verify_once`: the one verify-once registry of optional kernels;
- :mod:`.files`: ``write_atomic``, a file written whole and never through a link.

Import floors of attn-core (each folder imports only from the ones before it):
``reference`` / ``core`` -> ``device`` -> ``native`` -> ``decode`` / ``prefill`` -> ``runtime``
-> the package's public names (tests/test_import_graph.py holds it).
"""
