"""What a failure means for a command line, in one line.

The database or the broker out of reach, or a schema not migrated.
"""

from __future__ import annotations

from processor._errors import SchemaNotMigrated
from processor._kafka.errors import unreachable as broker_unreachable
from processor._postgres.connect import database_name
from processor._postgres.errors import not_migrated as missing_in_schema
from processor._postgres.errors import unreachable as database_unreachable
from processor.settings import ProcessorSettings

__all__ = ["not_migrated", "unreachable"]


def unreachable(e: BaseException) -> str | None:
    """One line saying the database or the broker is out of reach; None for any other failure."""
    return database_unreachable(e) or broker_unreachable(e)


def not_migrated(e: BaseException, settings: ProcessorSettings | None) -> str | None:
    """One line naming `saga-processor migrate`, when ``e`` says the schema lacks the tables.

    That is a :class:`SchemaNotMigrated`, or a missing table, column or schema the database
    reported (:data:`processor._postgres.errors.NOT_MIGRATED`); None for any other failure.
    """
    what = str(e) if isinstance(e, SchemaNotMigrated) else missing_in_schema(e)
    if what is None:
        return None
    where = "the schema"
    if settings is not None:
        url = settings.database.url.get_secret_value()
        where = f"the schema {settings.database.schema_name} in database {database_name(url)}"
    return (
        f"{where} is not migrated (or is older than this release): run `saga-processor "
        f"migrate` ({what})"
    )
