"""The authoring API's implementation: what saga and participant authors declare, and its checks.

Messages, handler decorators and the handles handlers are given (``messages``, ``definition``,
``handles``, ``params``, ``binding``, ``upcasting``), sagas as explicit state machines and
ordered steps (``orchestration``), participants' command handlers (``participant``), the
applications that name them (``application``) and their AsyncAPI document (``asyncapi``).
Users import these names from :mod:`processor` and :mod:`processor.participant`. Nothing here
imports a Kafka or PostgreSQL client.
"""
