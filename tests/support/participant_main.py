"""The demo's participant service as a process, with a fault named by SAGA_FAULT_* variables.

The same variables as ``tests.support.proc_main``; the service fires ``revoke`` only.
"""

from __future__ import annotations

import sys

from demo.participants import main as participants_main
from tests.support.proc_main import hooks_from_env

if __name__ == "__main__":
    sys.exit(participants_main(sys.argv[1:], hooks=hooks_from_env()))
