"""`python -m demo` (what `make demo` runs)."""

import sys

from demo.run import main

sys.exit(main())
