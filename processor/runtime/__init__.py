"""The runtime loops: the consumer worker, the outbox relay, the deadline poller, and the
processor that supervises them. They speak only to the ports of :mod:`processor.ports`; the
adapters are chosen when a processor is assembled."""
