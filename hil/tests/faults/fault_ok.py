"""Passes: the suite around a fault whose results must stay intact."""


def test_one():
    assert sum(range(10)) == 45


def test_two():
    assert "hil".upper() == "HIL"
