"""hil: run bi100-attn's suites on real devices through the Docker Engine API, and survive them.

Entry point: ``python -m hil`` (see :mod:`hil.cli`). The pieces, in the order a run uses them:
config (targets, suites) -> image (content-hash tag) -> payload -> executor_docker /
executor_local (watchdog) -> junit + status (classification) -> quarantine -> summary.
"""
