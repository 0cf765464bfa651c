"""`make demo`: the example sagas against a simulated accounts service, with faults injected.

`python -m demo` runs it; `python -m demo.accounts` runs the accounts service on its own. It
lives outside the `processor` package (and outside the wheel): an entrypoint that may talk to
Kafka and PostgreSQL directly.
"""
