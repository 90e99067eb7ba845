"""FTS5's BM25 formula (k1 = 1.2, b = 0.75), shared by the scoring and the postings reads."""

from __future__ import annotations

import math

import numpy as np

from ._array_types import Bm25Floats

__all__ = [
    "K1",
    "B",
    "contribution",
    "contribution_into",
    "idf_of",
    "length_norms",
    "length_norms_into",
    "normed_contribution",
    "weighted_tf",
]

K1 = 1.2
B = 0.75


def idf_of(n: float, df: float) -> float:
    """FTS5's idf: ``log((N - df + 0.5) / (df + 0.5))``, never below 1e-6 (a word in most
    documents still counts a little)."""
    idf = math.log((n - df + 0.5) / (df + 0.5))
    return idf if idf > 0 else 1e-6


def contribution(idf: float, tf: Bm25Floats, sizes: Bm25Floats, avg: float) -> Bm25Floats:
    """What a word adds to the scores of documents of lengths ``sizes`` holding it ``tf`` times
    (column weighted)."""
    return idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * sizes / avg))


def length_norms(sizes: Bm25Floats, avg: float) -> Bm25Floats:
    """The part of :func:`contribution` that depends on a document's length only, the same
    for every word: ``contribution(idf, tf, sizes, avg)`` equals
    ``normed_contribution(idf, tf, length_norms(sizes, avg))`` to the last bit."""
    return K1 * (1.0 - B + B * sizes / avg)


def normed_contribution(idf: float, tf: Bm25Floats, norms: Bm25Floats) -> Bm25Floats:
    """:func:`contribution` from the documents' :func:`length_norms`."""
    return idf * tf * (K1 + 1.0) / (tf + norms)


# The ``_into`` forms compute the same bits (each sum and product is the same operation on the
# same two numbers, only the operands' order differs) in arrays the caller no longer needs:
# a fresh process faults in every page of every new array, ~1.4 ms per 230k postings each.


def length_norms_into(sizes: Bm25Floats, avg: float) -> Bm25Floats:
    """:func:`length_norms` of ``sizes``, computed in (and returned as) ``sizes``."""
    np.multiply(sizes, B, out=sizes)
    np.divide(sizes, avg, out=sizes)
    np.add(sizes, 1.0 - B, out=sizes)
    np.multiply(sizes, K1, out=sizes)
    return sizes


def contribution_into(idf: float, tf: Bm25Floats, norms: Bm25Floats, *, own_tf: bool) -> Bm25Floats:
    """:func:`normed_contribution`, computed in ``norms`` (overwritten) and, when ``own_tf``, in
    ``tf`` (returned; else a new array)."""
    np.add(norms, tf, out=norms)
    out = np.multiply(tf, idf, out=tf if own_tf else None)
    np.multiply(out, K1 + 1.0, out=out)
    np.divide(out, norms, out=out)
    return out


def weighted_tf(idf: float, scores: Bm25Floats, sizes: Bm25Floats, avg: float) -> Bm25Floats:
    """The ``tf`` whose :func:`contribution` is ``scores`` (a word scored alone by FTS5)."""
    return scores * K1 * (1.0 - B + B * sizes / avg) / (idf * (K1 + 1.0) - scores)
