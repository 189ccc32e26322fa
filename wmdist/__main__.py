"""`python -m wmdist ...` is the `wmdist` command (also what torchrun -m wmdist runs)."""
import sys

from wmdist.app.cli import main

sys.exit(main())
