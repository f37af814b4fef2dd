import sys

from attn_sim.cli import main

sys.exit(main())
