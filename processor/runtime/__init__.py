"""The runtime loops, the processor that supervises them, and a participant service's loops.

The consumer worker, the outbox relay, the deadline poller and the participant service speak
only to the ports of :mod:`processor.ports`; the adapters are chosen by the composition root
(:mod:`processor.bootstrap`), which the runtime never imports.
"""
