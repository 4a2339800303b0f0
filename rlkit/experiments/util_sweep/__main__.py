"""``python -m rlkit.experiments.util_sweep``: one point of the sweep, or ``reanalyze FOLDER...``."""
import sys

from rlkit.experiments.util_sweep.point import main

sys.exit(main())
