"""The runtime loops and the processor that supervises them.

The consumer worker, the outbox relay and the deadline poller speak only to the ports of
:mod:`processor.ports`; the adapters are chosen when a processor is assembled.
"""
