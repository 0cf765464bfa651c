"""`python -m processor.demo` (what `make demo` runs)."""

import sys

from processor.demo.run import main

sys.exit(main())
