"""The native kernels: one CUDA C++ source per family (``csrc/``) for nvcc and CoreX's clang.

The layer every family shares, and each family's binding:

- :mod:`.family` (what each library is built from), :mod:`.toolchain` and :mod:`.build`
  (finding the compiler, building every family's variants; standard library only, so
  ``setup.py`` prebuilds at ``pip install``);
- :mod:`.abi` (element kinds, head buckets, the partials layout, ctypes declarations, the
  launch stream) and :mod:`.loader` (one loader, status and error for every family: prebuilt,
  cached, or built on first use; :func:`~.loader.native_ready` adds the verify-once check);
- :mod:`.split` (how each family tiles and splits its work: the planners read it) and
  :mod:`.facts` (the compiled kernels' registers and shared memory, for plans and the simulator);
- the bindings: :mod:`.decode` (paged decode) and :mod:`.prefill` (chunked prefill), each a
  library class naming its family, its structs, its launch and its reference check.

Nothing here is required: without a toolkit or a GPU the package works and attention runs the
torch path. attn-core uses a kernel only after it matched the float64 reference on the device.
"""
