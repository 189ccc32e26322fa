"""`python -m wmdist ...` is the `wmdist` command (also what torchrun -m wmdist runs)."""
import sys

from wmdist.cli import main

sys.exit(main())
