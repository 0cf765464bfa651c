"""Kafka adapter: the only part of the processor that imports confluent_kafka."""
