"""Settings and names of the embedded server: file names in the data directory, the OS user, the cluster's settings."""

from __future__ import annotations

import logging
from pathlib import Path
import platformdirs


log = logging.getLogger(__name__)

SERVER_USER_WHEN_ROOT = "embedded_postgres"
PASSFILE = "skiplock.pgpass"  # in the data directory: the superuser's password, pgpass format, 0600
ADDRESS_FILE = "skiplock.conf"  # in the data directory: port, socket directory, TCP (kept across restarts)
TCP_ENV = "SKIPLOCK_EMBEDDED_TCP"
TCP_HOST = "127.0.0.1"
SOCKET_PARENT = Path("/tmp")  # for the socket directory of data directories with long paths
SOCKET_PREFIX = "skiplock-sock-"
SUPERUSER = "postgres"

_INCLUDE = f"include_if_exists = '{ADDRESS_FILE}'  # skiplock: this server's address, kept across restarts\n"

# Settings written once into a new cluster's postgresql.conf. Sized for a job queue on a small
# machine: enough connections for 8 workers x 8 slots plus tools, autovacuum kept eager. Where the
# server listens comes last, from the address file.
CLUSTER_SETTINGS = """
# --- added by skiplock ---
max_connections = 300
shared_buffers = 256MB
log_min_messages = warning
log_line_prefix = '%m [%p] %u@%d '
autovacuum_naptime = 1s
password_encryption = scram-sha-256
""" + _INCLUDE


def default_data_dir() -> Path:
    """The data directory used when neither ``--data-dir`` nor ``SKIPLOCK_DATA_DIR`` is given."""
    return platformdirs.user_data_path("skiplock") / "postgres-18"

