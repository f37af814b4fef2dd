import sys

from hil.cli import main

sys.exit(main())
