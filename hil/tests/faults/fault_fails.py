"""An ordinary failing test: FAIL, not HANG or ERROR."""


def test_fails():
    assert 1 + 1 == 3
