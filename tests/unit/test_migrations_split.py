"""Migration steps split into statements, as they are sent to Citus (one statement at a time)."""

from __future__ import annotations

from processor._postgres.schema.runner import split_statements
from processor._postgres.schema.tables import MIGRATIONS, Tables


def test_semicolons_in_quotes_dollar_quotes_and_comments_do_not_end_a_statement() -> None:
    step = """
    -- a comment; with a semicolon
    CREATE TABLE t (a text DEFAULT 'x;y', "b;c" int);
    /* block; comment */ INSERT INTO t VALUES ('it''s; here', 1);
    DO $$ BEGIN PERFORM 1; PERFORM 2; END $$;
    DO $body$ BEGIN RAISE NOTICE '$$;'; END $body$;
    SELECT $1;
    """
    got = [s.strip() for s in split_statements(step)]
    assert len(got) == 5
    assert got[0].endswith("""CREATE TABLE t (a text DEFAULT 'x;y', "b;c" int);""")
    assert got[1].endswith("""INSERT INTO t VALUES ('it''s; here', 1);""")
    assert got[2] == "DO $$ BEGIN PERFORM 1; PERFORM 2; END $$;"
    assert got[3] == "DO $body$ BEGIN RAISE NOTICE '$$;'; END $body$;"
    assert got[4] == "SELECT $1;"


def test_every_released_step_splits_back_into_its_own_text() -> None:
    tables = Tables("s")
    for step in MIGRATIONS:
        text = tables.render(step)
        parts = split_statements(text)
        assert parts
        assert "".join(parts).strip() == text.strip()
        assert all(p.strip().endswith(";") for p in parts[:-1])
