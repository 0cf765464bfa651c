"""`python -m processor` is the `saga-processor` console script."""

import sys

from processor._cli import main

sys.exit(main())
