-- The migration bookkeeping itself (version 0, applied before any other): which versions are
-- complete, and which steps of a version are done (a version with steps recorded but no row in
-- {schema_version} is half-applied: migrate finishes it, check_schema reports it).

-- step: migration_steps
CREATE TABLE IF NOT EXISTS {migration_steps} (
    version INT          NOT NULL,
    step    VARCHAR(100) NOT NULL,
    done_at DATETIME(6)  NOT NULL,
    PRIMARY KEY (version, step)
) ENGINE=InnoDB;

-- step: schema_version
CREATE TABLE IF NOT EXISTS {schema_version} (
    version    INT         NOT NULL PRIMARY KEY,
    applied_at DATETIME(6) NOT NULL
) ENGINE=InnoDB;
