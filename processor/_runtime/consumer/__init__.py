"""The consumer loop and what it alone uses: intake, ownership, recovery, its store's lanes.

:mod:`~processor._runtime.consumer.worker` runs one batch per poll; the other modules are its
parts: what it reads ahead (``intake``), the partitions it owns (``ownership``), how a batch is
made and committed (``steps``, ``batch``, ``access``, ``lane``), what it does when a commit
fails or its outcome is unknown (``recovery``, ``isolate``, ``availability``), the keys another
partitioner would place elsewhere (``placement``) and its counters (``stats``).
"""
