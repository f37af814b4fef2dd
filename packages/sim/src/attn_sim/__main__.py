import sys

from attn_sim.launch import main

sys.exit(main())
