"""``python -m rlkit.report [--write]``: the generated blocks of README.md and docs/*.md (see :mod:`rlkit.report.sections`)."""
import sys

from rlkit.report.sections import main

sys.exit(main())
