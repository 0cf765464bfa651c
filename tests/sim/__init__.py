"""A deterministic simulation of the processor: the real loops in a seeded, faulty world."""
