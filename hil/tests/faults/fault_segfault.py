"""Dies of SIGSEGV: reads address 0."""

import ctypes


def test_segfault():
    ctypes.string_at(0)
