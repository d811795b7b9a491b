"""Scratch stores for a benchmark run, so that user data is never touched.

* SQLite: every store is a fresh file in a temporary folder (beside the file named by the URL,
  so the same disk is measured), removed afterwards.
* PostgreSQL: every store is a fresh schema (``eg_bench_<run>_<name>``) in the URL's database,
  reached through ``search_path``, dropped afterwards with everything in it. Where the role may
  not create schemas, the URL's own tables are used with scratch namespaces, and exactly those
  rows (and the raw baseline's tables) are deleted afterwards.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from ..errors import ConfigError, StoreError
from .baseline import RawPostgres, RawSqlite, connect_postgres

__all__ = ["DEFAULT_PG_URL", "Scratch", "new_run_id", "postgres_reachable"]

log = logging.getLogger("effectgate")
DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _libpq(url: str) -> str:
    """A SQLAlchemy Postgres URL as a libpq connection URI."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def postgres_reachable(url: str, timeout: float = 3.0) -> str | None:
    """None when ``url`` accepts a connection, else why not."""
    try:
        import psycopg

        with psycopg.connect(_libpq(url), connect_timeout=int(timeout)):
            return None
    except Exception as err:
        return f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err) else ''}"


class Scratch:
    """Fresh stores on one backend, named per use, all removed by :meth:`close`."""

    def __init__(self, url: str, run: str) -> None:
        self.base_url = url
        self.run = run
        self.backend = "postgres" if make_url(url).get_backend_name() == "postgresql" else "sqlite"
        self.folder: Path | None = None
        self.schemas: list[str] = []
        self.raw_tables: list[str] = []
        self.use_schemas = True
        if self.backend == "sqlite":
            database = make_url(url).database or ""
            parent = Path(database).expanduser().resolve().parent if database else None
            if parent is not None:
                parent.mkdir(parents=True, exist_ok=True)
            self.folder = Path(tempfile.mkdtemp(prefix=f"effectgate-bench-{run}-", dir=parent))
        else:
            self.use_schemas = self._try_schema()

    def describe(self) -> str:
        """Where this run's stores live, for the report."""
        if self.backend == "sqlite":
            return f"sqlite: fresh files in {self.folder}"
        where = make_url(self.base_url).render_as_string(hide_password=True)
        how = "fresh schemas" if self.use_schemas else "scratch namespaces in the URL's tables"
        return f"postgres: {how} in {where}"

    # -- names -----------------------------------------------------------------------------

    def namespace(self, name: str) -> str:
        """The gate namespace for the store ``name``."""
        return f"bench-{self.run}-{name}"

    def _schema(self, name: str) -> str:
        return f"eg_bench_{self.run}_{name}".replace("-", "_").lower()

    def _try_schema(self) -> bool:
        probe = self._schema("probe")
        try:
            with self._admin() as conn:
                conn.execute(f'CREATE SCHEMA "{probe}"')
                conn.execute(f'DROP SCHEMA "{probe}"')
            return True
        except (StoreError, ConfigError):
            raise  # the server is not reached (or its URL not read): no namespaces either
        except Exception as err:
            log.info("bench: cannot create a scratch schema (%s); using namespaces", err)
            return False

    def _admin(self) -> Any:
        return connect_postgres(_libpq(self.base_url))

    def _pg_url(self, name: str) -> str:
        if not self.use_schemas:
            return self.base_url
        schema = self._schema(name)
        if schema not in self.schemas:
            with self._admin() as conn:
                conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            self.schemas.append(schema)
        parsed = make_url(self.base_url)
        return parsed.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(
            hide_password=False
        )

    # -- stores ----------------------------------------------------------------------------

    def url(self, name: str) -> str:
        """A store URL for the gate; a fresh, empty store the first time ``name`` is used."""
        if self.backend == "sqlite":
            assert self.folder is not None
            return f"sqlite:///{self.folder / (name + '.db')}"
        return self._pg_url(name)

    def dsn(self, name: str) -> str:
        """The store ``name`` as a libpq connection string (Postgres only)."""
        return _libpq(self._pg_url(name))

    def raw(self, name: str, **options: Any) -> RawSqlite | RawPostgres:
        """A raw-driver baseline on its own fresh file (SQLite) or the store's schema."""
        namespace = self.namespace(name)
        if self.backend == "sqlite":
            assert self.folder is not None
            return RawSqlite(str(self.folder / f"raw-{name}.db"), namespace=namespace, **options)
        table = "raw_effects" if self.use_schemas else f"eg_bench_raw_{self.run}_{name}"
        if not self.use_schemas:
            self.raw_tables.append(table)
        return RawPostgres(self.dsn(name), namespace=namespace, table=table, **options)

    def path(self, name: str) -> str:
        """The SQLite file of the store ``name``."""
        assert self.folder is not None
        return str(self.folder / (name + ".db"))

    # -- clean-up --------------------------------------------------------------------------

    def close(self) -> None:
        """Remove every scratch store this run made."""
        if self.backend == "sqlite":
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)
            return
        with contextlib.suppress(Exception), self._admin() as conn:
            for schema in self.schemas:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            for table in self.raw_tables:
                conn.execute(f'DROP TABLE IF EXISTS "{table}"')
            if not self.use_schemas:
                pattern = f"bench-{self.run}-%"
                conn.execute("DELETE FROM effectgate_effects WHERE namespace LIKE %s", (pattern,))
                others = conn.execute(
                    "SELECT table_name FROM information_schema.columns WHERE column_name = "
                    "'namespace' AND table_name LIKE 'effectgate%%' AND table_name <> "
                    "'effectgate_effects' AND table_schema = current_schema()"
                ).fetchall()
                for (table,) in others:
                    conn.execute(f'DELETE FROM "{table}" WHERE namespace LIKE %s', (pattern,))

    def __enter__(self) -> Scratch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def new_run_id() -> str:
    """A short id for this run's scratch names."""
    return os.urandom(4).hex()

