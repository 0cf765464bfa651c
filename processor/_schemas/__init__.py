"""Records in Confluent's Schema Registry wire format: JSON Schema, Avro and Protobuf.

``formats`` and ``generate`` are pure; ``codec`` translates records given the schemas it was
told of; ``client`` and ``resolver`` are the registry's adapter, which fetches and registers.
"""
