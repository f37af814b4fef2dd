"""``python -m engine_patch status``."""

import sys

from engine_patch.cli import main

sys.exit(main())
