"""pytest plumbing for engine-patch's tests."""

from __future__ import annotations

import pytest

from attn_core.reference.threads import share_cores_among_workers


def pytest_configure(config: pytest.Config) -> None:
    share_cores_among_workers()
