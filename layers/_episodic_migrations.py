"""The episodic store's schema migrations, in order (applied by ``EpisodicMemory`` at open)."""

from __future__ import annotations

from memstrata.storage import Database, Migration, NamedMigration

from ._episode_records import CONTEXT_SCHEMA, episodes_schema, refresh_context

__all__ = ["_MIGRATIONS"]

_MIGRATIONS: list[Migration] = [
    episodes_schema(archive=False)
    + """
    CREATE TABLE archives (
      path TEXT PRIMARY KEY,
      archive_uuid TEXT NOT NULL,
      episodes INTEGER NOT NULL,
      removed INTEGER NOT NULL,
      first_at_us INTEGER,
      last_at_us INTEGER,
      created_us INTEGER NOT NULL
    );
    """,
]


def _index_turn_context(db: Database) -> None:
    """Migration 2: the neighbouring-episode context index, filled for existing task runs."""
    for statement in CONTEXT_SCHEMA:
        db.execute(statement)
    ids = [int(r[0]) for r in db.query("SELECT id FROM episodes WHERE task_run_id IS NOT NULL ORDER BY id")]
    for start in range(0, len(ids), 5000):
        refresh_context(db, ids[start : start + 5000])


_MIGRATIONS.append(_index_turn_context)
# Migration 3: the uuids of deleted episodes, so an archive made before the deletion never
# brings one back (search with archives drops it, restore skips it)
_MIGRATIONS.append("CREATE TABLE deleted_episodes (uuid TEXT PRIMARY KEY, deleted_us INTEGER NOT NULL)")
# Migration 4: new episodes reach the full-text indexes in one statement per index and write
# (``EpisodicWrites._indexed``); the per-row insert trigger cost 3x that in a bulk record
_MIGRATIONS.append(NamedMigration("bulk-ingest-1", "DROP TRIGGER IF EXISTS episodes_ai"))
