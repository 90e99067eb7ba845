"""The episodic store's schema migrations, in order (applied by ``EpisodicMemory`` at open)."""

from __future__ import annotations

import logging
from pathlib import Path

from memstrata.core.errors import ArchiveError
from memstrata.storage import Database, Migration, NamedMigration

from ._archive import ArchiveFile
from ._episode_records import CONTEXT_SCHEMA, episodes_schema, refresh_context
from ._episodic_inputs import episode_digest

__all__ = ["_MIGRATIONS"]

log = logging.getLogger("memstrata.episodic")

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


def remember_identities(db: Database) -> None:
    """Migration 5: deletions keep their episode's digest, and the store keeps the uuid and
    digest of every episode its archives hold (filled from the archives it tracks; one that
    cannot be read now is left out, as its episodes cannot be restored from it either)."""
    db.execute("ALTER TABLE deleted_episodes ADD COLUMN digest TEXT")
    db.execute("CREATE TABLE archived_episodes (uuid TEXT PRIMARY KEY, digest TEXT NOT NULL) WITHOUT ROWID")
    for (path,) in db.query("SELECT path FROM archives ORDER BY created_us, path"):
        try:
            archive = ArchiveFile(Path(str(path)), verify=False)
            try:
                rows = archive.rows()
            finally:
                archive.close()
        except ArchiveError as exc:
            log.warning("episodic %s: the uuids of archive %s are not known: %s", db.path, path, exc)
            continue
        db.executemany(
            "INSERT OR IGNORE INTO archived_episodes(uuid, digest) VALUES (?, ?)",
            [(str(r[1]), episode_digest(r)) for r in rows],
        )


# Migration 5: what an episode is (its digest) for deletions and archived episodes, so a new
# episode never takes a uuid the store holds and import and restore skip only the same episode
_MIGRATIONS.append(NamedMigration("episode-identity-1", remember_identities))
