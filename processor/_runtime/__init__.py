"""The runtime loops, the processor that supervises them, and a participant service's loops.

The consumer loop and its parts are in :mod:`processor._runtime.consumer`, a participant
service's loops in :mod:`processor._runtime.participant`; the relay, the deadline poller, the
retention and growth loops, the supervisor and the processor that runs them all are here. They
speak only to the ports of :mod:`processor._ports`; the adapters are chosen by the composition
root (:mod:`processor._bootstrap`), which the runtime never imports.
"""
