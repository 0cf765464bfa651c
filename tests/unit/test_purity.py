"""The authoring API, the examples and the schemas import no Kafka or PostgreSQL client."""

import subprocess
import sys

CHECK = """
import sys
import processor, processor.runner, processor.testing, sagas, schemas, schemas.export
heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('confluent_kafka', 'psycopg'))
print(','.join(heavy))
"""


def test_pure_modules_do_not_import_kafka_or_postgres_clients() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""


def test_public_api_is_curated() -> None:
    import processor

    assert "SagaFixture" not in processor.__all__
    for name in processor.__all__:
        assert hasattr(processor, name), name
    assert processor.message_registry is processor.messages.registry
