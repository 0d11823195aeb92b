-- skiplock's MySQL/MariaDB schema, version 2: the workers running now (worker/presence.py), each
-- advertising itself with what it can take; refreshed every few seconds, deleted when it exits.

-- step: workers
CREATE TABLE IF NOT EXISTS {workers} (
    id          CHAR(36)     NOT NULL PRIMARY KEY,
    name        VARCHAR(255) NOT NULL,
    tasks       LONGTEXT     NOT NULL CHECK (JSON_VALID(tasks)),
    queues      LONGTEXT     NULL CHECK (queues IS NULL OR JSON_VALID(queues)),
    host        VARCHAR(255) NULL,
    pid         INT          NULL,
    concurrency INT          NULL,
    started_at  DATETIME(6)  NOT NULL,
    last_seen   DATETIME(6)  NOT NULL,
    KEY workers_last_seen (last_seen)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
