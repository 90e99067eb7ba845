"""Ranking items by meaning: the best field's cosine similarity over every admitted item.

The vectors are mirrored in memory (rebuilt when this or another connection wrote) and the items
the prefix and filter admit come from SQL, so a search scans no BLOB and does one product.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from memstrata.core.errors import InvalidInputError

from ._item_records import ItemRecord, ItemStoreState, _record

__all__ = ["ItemRanking"]


class ItemRanking(ItemStoreState):
    """The vector search of :class:`~._items.ItemStore` (one of its bases)."""

    _mirror: tuple[tuple[int, int], npt.NDArray[np.int64], npt.NDArray[np.float32]] | None

    def _ranked(
        self,
        cols: str,
        sql_where: str,
        params: list[Any],
        query_vector: Sequence[float],
        limit: int,
        offset: int,
    ) -> list[ItemRecord]:
        q = np.asarray(query_vector, dtype=np.float32).ravel()
        qn = float(np.linalg.norm(q))
        need = offset + limit
        if need == 0:
            return []
        scored: list[tuple[int, float | None]] = []
        found = self._admitted_vectors(sql_where, params, q.size)
        if found is not None:
            ids, unit = found  # unit rows, sorted by item id
            sims = unit @ (q / qn) if qn > 0 else np.zeros(len(ids), dtype=np.float32)
            starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
            uniq, best = ids[starts], np.maximum.reduceat(sims, starts)  # each item's best field
            if need < len(best):
                # every item tied with the need-th best stays: which of them a partition keeps
                # depends on ``need``, so pages of one query would skip and repeat tied items
                cut = best[np.argpartition(-best, need - 1)[need - 1]]
                keep = np.flatnonzero(best >= cut)
                uniq, best = uniq[keep], best[keep]
            ranked = np.lexsort((uniq, -best))[:need]  # best score first, then older item
            scored = [(int(uniq[j]), float(best[j])) for j in ranked]
        order = scored
        if len(scored) < need:  # items stored without vectors follow, unscored
            plain = self._db.query(
                f"SELECT i.id FROM items i WHERE {sql_where} AND NOT EXISTS"
                " (SELECT 1 FROM item_vectors v WHERE v.item_id = i.id)"
                " ORDER BY i.updated_at DESC, i.id DESC LIMIT ?",
                (*params, need - len(scored)),
            )
            order = [*scored, *((r[0], None) for r in plain)]
        page = order[offset : offset + limit]
        if not page:
            return []
        marks = ",".join("?" * len(page))
        rows = {
            r[0]: r
            for r in self._db.query(
                f"SELECT {cols} FROM items i WHERE i.id IN ({marks})", [p[0] for p in page]
            )
        }
        return [_record(rows[i], score) for i, score in page if i in rows]

    def _admitted_vectors(
        self, sql_where: str, params: list[Any], dim: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]] | None:
        """(item id per vector, vectors) of the items the prefix and filter admit, or None.

        The vectors are mirrored in memory (rebuilt when this or another connection wrote), and
        the admitted ids come from SQL in one row, so a search scans no BLOB and does one product.
        """
        version = (self._db.data_version(), self._writes)
        if self._mirror is None or self._mirror[0] != version:
            rows = self._db.query("SELECT item_id, vec FROM item_vectors ORDER BY item_id")
            ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            raw = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32)
            width = raw.size // len(rows) if rows else dim
            if rows and raw.size != len(rows) * width:
                raise InvalidInputError("stored vectors have different dimensions: re-create the index")
            mat = raw.reshape(len(rows), width)
            norms = np.linalg.norm(mat, axis=1, keepdims=True)
            unit = np.divide(mat, norms, out=np.zeros_like(mat), where=norms > 0)
            self._mirror = (version, ids, unit)
        _, all_ids, all_vecs = self._mirror
        if len(all_ids) == 0:
            return None
        if all_vecs.shape[1] != dim:
            raise InvalidInputError(
                f"query vector has {dim} dimensions but the stored vectors have {all_vecs.shape[1]}"
            )
        listed = self._db.scalar(f"SELECT group_concat(i.id) FROM items i WHERE {sql_where}", params)
        if not listed:
            return None
        admitted = np.array(listed.split(","), dtype=np.int64)
        mask = np.isin(all_ids, admitted, assume_unique=False)
        if not mask.any():
            return None
        return all_ids[mask], all_vecs[mask]
