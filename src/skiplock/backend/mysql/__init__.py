"""The MySQL 8.0.1+ / MariaDB 10.6+ backend (issue 12): the same claim -- ``SELECT … FOR UPDATE SKIP
LOCKED`` at READ COMMITTED, then updates by primary key in the same transaction -- through PyMySQL.
See docs/mysql.md (the driver chosen by measurement, what is tested, what differs on MySQL 8)."""

from .backend import MySQLBackend

__all__ = ["MySQLBackend"]
