"""What operators watch: Prometheus metrics, health probes, structured logs and trace spans.

Nothing here sits on the hot path beyond one call per batch: counters are read from the loops'
own tallies when Prometheus scrapes, histograms are observed once per batch, and the gauges
that need the database are sampled on an interval by a background thread.
"""
