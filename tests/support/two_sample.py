"""A two-sample test for "these two samplers draw from the same distribution over short token sequences".

Used by ``tests/test_plugin_distribution.py`` to compare what a speculative server samples at temperature 1
with what plain decoding samples. No server and no model here: only counting and numpy.

``binned_table(a, b, min_count=10) -> (table [2, K] int64, cells)``
    Each sample is a tuple of token ids (the first few generated tokens). Rare outcomes are binned twice,
    on the *pooled* counts (so the binning is the same for every relabelling of the pooled samples and
    the permutation test below stays exact): per position, a token seen fewer than ``min_count`` times
    at that position becomes ``-1``; then the binned tuples seen fewer than ``min_count`` times go into
    one "other" column (the last, dropped when empty). ``cells`` lists the tuples of the other columns.

``chi_square(table) -> float``
    Pearson's statistic of homogeneity for a 2 x K table.

``permutation_p_value(table, draws, rng) -> float``
    P-value of ``chi_square`` under "both rows come from one distribution", by Monte Carlo over the
    relabellings of the pooled samples: with the column totals fixed, the first row's counts are
    multivariate hypergeometric. ``(1 + #{stat >= observed}) / (1 + draws)``, valid at any sample size
    (no chi-square approximation, which the few-count columns would break).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

Sample = Sequence[tuple[int, ...]]


def binned_table(a: Sample, b: Sample, min_count: int = 10) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    pooled = [*a, *b]
    if not a or not b:
        raise ValueError("both samples must be non-empty")
    length = len(pooled[0])
    if any(len(s) != length for s in pooled):
        raise ValueError("every sample must have the same number of tokens")
    keep = []
    for k in range(length):
        counts = Counter(s[k] for s in pooled)
        keep.append({t for t, n in counts.items() if n >= min_count})

    def symbol(s: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(t if t in keep[k] else -1 for k, t in enumerate(s))

    sa, sb = [symbol(s) for s in a], [symbol(s) for s in b]
    counts = Counter(sa + sb)
    cells = sorted(x for x, n in counts.items() if n >= min_count)
    index = {x: i for i, x in enumerate(cells)}
    other = len(cells)
    table = np.zeros((2, other + 1), dtype=np.int64)
    for row, symbols in enumerate((sa, sb)):
        for s in symbols:
            table[row, index.get(s, other)] += 1
    if table[:, other].sum() == 0:
        table = table[:, :other]
    return table, cells


def _expected(table: np.ndarray) -> np.ndarray:
    return np.outer(table.sum(1), table.sum(0)) / table.sum()


def chi_square(table: np.ndarray) -> float:
    expected = _expected(table)
    return float(((table - expected) ** 2 / expected).sum())


def permutation_p_value(table: np.ndarray, draws: int, rng: np.random.Generator) -> float:
    table = np.asarray(table, dtype=np.int64)
    if table.shape[1] < 2:
        return 1.0  # one column: nothing can differ
    observed = chi_square(table)
    columns = table.sum(0)
    expected = _expected(table)
    first = rng.multivariate_hypergeometric(columns, int(table[0].sum()), size=draws)
    second = columns - first
    stats = (((first - expected[0]) ** 2 / expected[0]).sum(1)
             + ((second - expected[1]) ** 2 / expected[1]).sum(1))
    # A relative tolerance: a relabelling that gives the observed table again must count as ">=".
    return (1 + int((stats >= observed * (1 - 1e-9)).sum())) / (1 + draws)
