-- skiplock's MySQL/MariaDB schema, version 5: the dashboard's audit log (skiplock.dashboard), as
-- PostgreSQL's migration 12. One row per action taken through the dashboard (retry, cancel, delete,
-- pause, resume, outbox redrive), written after the action: who (the role and how it authenticated,
-- never a token), what, on which filter or ids (JSON), and how many rows it touched. Read newest
-- first, by id (keyset: `audit_rows` in queries.sql). Nothing in skiplock deletes these rows.

-- step: audit_log
CREATE TABLE IF NOT EXISTS {audit_log} (
    id       BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
    at       DATETIME(6) NOT NULL,
    actor    TEXT        NOT NULL,
    action   TEXT        NOT NULL,
    target   LONGTEXT    NOT NULL CHECK (JSON_VALID(target)),
    affected INT         NOT NULL DEFAULT 0 CHECK (affected >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
