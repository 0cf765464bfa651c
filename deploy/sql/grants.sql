-- Least privilege for the saga processor: an owner role that migrates, a runtime role that only
-- reads and writes rows. Run once per database as an administrator (a superuser, or a role with
-- CREATEROLE that is a member of the roles it creates), with psql variables naming the parts:
--
--   psql "$ADMIN_URL" -v database=saga -v schema=saga -v owner=saga_owner \
--        -v runtime=saga_runtime -v reader=saga_reader -f deploy/sql/grants.sql
--
-- Then give both roles credentials (\password saga_owner, or client certificates), and run
--   saga-processor migrate   with SAGA_DATABASE__URL for the owner (a Job, on every upgrade);
--   saga-processor run       with SAGA_DATABASE__URL for the runtime role and
--                            SAGA_DEADLINE__SCHEMA__AUTO=false (it cannot create tables);
--   saga-processor console   with SAGA_DATABASE__URL for the reader role: it reads every table
--                            and changes none (its actions on sagas are operator records through
--                            Kafka; dead-letter and failed-outbox actions need the runtime role).
-- The script may run before or after the first migration: existing tables are granted below,
-- tables created later by the owner through its default privileges.
\set ON_ERROR_STOP on

CREATE ROLE :"owner" LOGIN NOINHERIT;
CREATE ROLE :"runtime" LOGIN NOINHERIT;
CREATE ROLE :"reader" LOGIN NOINHERIT;
GRANT CONNECT ON DATABASE :"database" TO :"owner", :"runtime", :"reader";

-- The owner owns the schema and so every table its migrations create there; nothing else.
CREATE SCHEMA IF NOT EXISTS :"schema" AUTHORIZATION :"owner";
REVOKE ALL ON SCHEMA :"schema" FROM PUBLIC;

-- The runtime role: rows only. No CREATE on the schema, no TRUNCATE, no REFERENCES, no TRIGGER.
-- LISTEN/NOTIFY and advisory locks need no grant.
GRANT USAGE ON SCHEMA :"schema" TO :"runtime";
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA :"schema" TO :"runtime";
-- Identity columns (outbox, history, dead letters, parked messages) draw from sequences.
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA :"schema" TO :"runtime";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA :"schema"
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO :"runtime";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA :"schema"
    GRANT USAGE, SELECT ON SEQUENCES TO :"runtime";

-- The reader role (a read-only console, dashboards, ad-hoc queries): SELECT and nothing else.
GRANT USAGE ON SCHEMA :"schema" TO :"reader";
GRANT SELECT ON ALL TABLES IN SCHEMA :"schema" TO :"reader";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA :"schema"
    GRANT SELECT ON TABLES TO :"reader";
