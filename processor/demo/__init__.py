"""`make demo`: the example sagas against a simulated accounts service, with faults injected.

`python -m processor.demo` runs it; `python -m processor.demo.accounts` runs the accounts service
on its own. This package is an entrypoint, so it may talk to Kafka and PostgreSQL directly.
"""
