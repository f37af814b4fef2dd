"""Blocks forever inside native code, as a call into a hung driver does.

``pause()`` sleeps in the kernel until a signal arrives; a Python-level signal handler (what
pytest-timeout's signal method relies on) never runs while the main thread is inside it.
"""

import ctypes


def test_blocks_in_native_code():
    ctypes.CDLL(None).pause()
