"""`python -m host_runtime.cli`: how serve starts its engine processes, as `everycycle` would."""

import sys

from host_runtime.cli import main

sys.exit(main())
