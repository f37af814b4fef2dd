"""``python -m hil`` from the repository root, before (or without) ``pip install ./hil``.

From the root, ``hil/`` (this folder, no ``__init__.py``) is found as a namespace package named
``hil`` whenever the real package (``hil/src/hil``) is not installed or on ``PYTHONPATH``, and
Python refused it with "'hil' is a package and cannot be directly executed". This file makes
that namespace package runnable: it puts ``hil/src`` first on ``sys.path``, drops the namespace
package from ``sys.modules`` and runs the real CLI. Where the real package is importable it wins
over this folder (a regular package beats a namespace portion), and this file is not used.
"""

import sys
from pathlib import Path

_SRC = str(Path(__file__).resolve().parent / "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)
for _name in [m for m in sys.modules if m == "hil" or m.startswith("hil.")]:
    if _name != __name__:
        del sys.modules[_name]

from hil.cli import main  # noqa: E402

sys.exit(main())
