"""Allocates (and touches) memory until the container's memory limit OOM-kills it."""


def test_allocates_past_the_limit():
    hog = []
    for _ in range(64):  # 64 x 64 MiB = 4 GiB, far past the test target's limit
        hog.append(b"\x01" * (64 * 1024 * 1024))  # filled, so every page is touched
    assert len(hog) == 64
