"""What vouches for a keyword index file: a random stamp the database keeps for one state of FTS5.

The file records FTS5's averages and structure records (its *mark*, which every write changes),
but two histories of the same shape reach the same records: a database restored from a backup and
then written like the history the file saw ("zebra" there, "yak" here: same length) gives the same
mark for other text. So the file also records a stamp drawn at random, which the database keeps
in its metadata together with the mark it was drawn for (``keyword_stamp:<fts>`` = ``"<mark>
<stamp>"``). A file is used only when the database holds the file's stamp for the index's mark as
it is now. A restored database holds a stamp of its own past, drawn for a mark its index has since
left (FTS5's structure record counts every segment ever written, so writes never bring an index
back to an earlier mark), or none: another history's file is never vouched for.

The stamp is drawn when a file is written (at close, by the process writing it; never on the
write path), again only once the index has moved on from the mark it was drawn for. A rebuild of
the index from its content starts FTS5's count afresh, so it drops the stamp (:func:`forget_stamp`).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

from ._connection import Database
from ._index_files import recorded_token, write_unwaited
from ._migrations import get_meta, set_meta

__all__ = ["forget_stamp", "vouch", "vouched_stamp"]


def _key(fts: str) -> str:
    return f"keyword_stamp:{fts}"


def vouched_stamp(db: Database, fts: str, mark: str) -> str | None:
    """The stamp the database keeps for ``fts`` at ``mark`` (``None``: none, or one drawn for
    another state of the index)."""
    try:
        value = get_meta(db, _key(fts))
    except Exception:  # no metadata readable: nothing is vouched for
        return None
    drawn_for, _, stamp = (value or "").partition(" ")
    return stamp if stamp and drawn_for == mark else None


def vouch(db: Database, fts: str, mark: str, mark_now: Callable[[], str | None]) -> tuple[str, str] | None:
    """The database's token and its stamp for ``fts`` at ``mark``, drawn now if it keeps none for
    that mark, to record in a file of that state. ``None`` when the index is no longer at ``mark``
    (``mark_now``, read under the write lock) or nothing can be written without waiting."""

    def write() -> tuple[str, str] | None:
        if mark_now() != mark:
            return None
        token = recorded_token(db)
        stamp = vouched_stamp(db, fts, mark)
        if stamp is None:
            stamp = secrets.token_hex(8)
            set_meta(db, _key(fts), f"{mark} {stamp}")
        return token, stamp

    return write_unwaited(db, write)


def forget_stamp(db: Database, fts: str) -> None:
    """Drop the stamp of ``fts`` (in the caller's transaction that rebuilds the index)."""
    if get_meta(db, _key(fts)) is not None:
        db.execute("DELETE FROM metadata WHERE key = ?", (_key(fts),))
