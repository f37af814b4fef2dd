"""The native decode kernel: one CUDA C++ source (``csrc/``) for nvcc and CoreX's clang.

- :mod:`.toolchain`, :mod:`.build`: finding the compiler and building (standard library only,
  so ``setup.py`` uses them at ``pip install``);
- :mod:`.abi`, :mod:`.library`: the C ABI through ctypes and loading (prebuilt, cached, or built
  on first use); :func:`load_native` never raises for a missing toolkit, it says why;
- :mod:`.launch`: one decode step from torch tensors.

Nothing here is required: without a toolkit or a GPU the package works and decode runs the
torch path. attn-core uses the kernel only after it matched the float64 reference on the device.
"""
