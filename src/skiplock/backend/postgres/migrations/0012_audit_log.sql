-- skiplock schema, version 12: the dashboard's audit log (skiplock.dashboard).
--
-- One row per action taken through the dashboard (retry, cancel, delete, pause, resume, redrive,
-- bulk or not), written after the action: who (the role and how it authenticated, never a token),
-- what, on which filter or ids (jsonb), and how many rows it touched. Read newest first, by id
-- (keyset: `audit_rows`). Nothing in skiplock deletes these rows; prune them with your own policy.
CREATE TABLE {schema}.audit_log (
    id       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT now(),
    actor    text        NOT NULL,
    action   text        NOT NULL,
    target   jsonb       NOT NULL DEFAULT '{{}}'::jsonb,
    affected integer     NOT NULL DEFAULT 0 CHECK (affected >= 0)
);
