"""The database host ``db`` of the distributed-state page's migration sample, on any machine.

A throwaway PostgreSQL (``tests/servers.py`` of a floodwall checkout, named by
``FLOODWALL_REPO``) holding the roles and the database the sample names: ``admin`` owns the
database ``app``; ``app`` may read and write rows but not create tables. libpq connects to it
(``PGHOSTADDR``, ``PGPORT``) instead of resolving ``db``. The server stops when the interpreter
exits (the harness' ``atexit`` safety net).
"""

import os
import sys

import psycopg

sys.path.insert(0, os.path.join(os.environ["FLOODWALL_REPO"], "tests"))
from servers import PostgresServer

postgres = PostgresServer().start()
with psycopg.connect(postgres.dsn, autocommit=True) as conn:
    conn.execute("CREATE ROLE admin LOGIN")
    conn.execute("CREATE ROLE app LOGIN")
    conn.execute("CREATE DATABASE app OWNER admin")
with psycopg.connect(postgres.dsn.rsplit("/", 1)[0] + "/app", autocommit=True) as conn:
    conn.execute(
        "ALTER DEFAULT PRIVILEGES FOR ROLE admin "
        "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO app"
    )
os.environ.update(PGHOSTADDR="127.0.0.1", PGPORT=str(postgres.port))
