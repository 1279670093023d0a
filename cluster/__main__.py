"""python -m cluster ...: the same as the rollout console script."""

import sys

from cluster.cli.main import main

sys.exit(main())
