"""A processor started with Kafka credentials runs and never writes them to its log."""

from __future__ import annotations

import pytest

from processor.settings import KafkaSettings
from tests.e2e.conftest import E2EEnv, log_lines
from tests.support.harness import wait_until
from tests.support.procs import ProcessorProcess

pytestmark = [pytest.mark.e2e]

# Harmless on a PLAINTEXT listener: librdkafka uses SASL and key settings only when the
# security protocol asks for them.
SECRETS = {
    "sasl.username": "user-alice-7f3a",
    "sasl.password": "pw-hunter2-7f3a",
    "ssl.key.password": "keypw-7f3a",
}


def test_kafka_credentials_stay_out_of_the_processor_log(e2e_env: E2EEnv) -> None:
    base = e2e_env.settings(instance_id="secretive")
    kafka = KafkaSettings(bootstrap_servers=e2e_env.kafka, config=dict(SECRETS))
    proc = ProcessorProcess(
        base.model_copy(update={"kafka": kafka}),
        e2e_env.logs / "secretive.log",
        app="sagas.app:transfer_app",
    )
    e2e_env.procs.append(proc)
    wait_until(
        lambda: (
            log_lines(proc, r"INFO processor\._runtime\.consumer\.worker.*: assigned")
            or not proc.alive()
        ),
        timeout=90,
        what="the processor to join its group",
    )
    assert proc.alive(), proc.log()
    assert proc.stop() == 0
    output = proc.log()
    assert log_lines(proc, r"processor secretive started"), output
    for value in SECRETS.values():
        assert value not in output
