"""engine.trace.pools.changed_runs: the runs of changed bytes a step's patch holds, found 8 bytes
at a time (or, where a small region has few changed bytes, joined in Python), equal to a byte-by-byte walk for every
alignment, length and gap."""

import numpy as np
import pytest

from engine.trace import pools
from engine.trace.pools import changed_runs


def runs_byte_by_byte(cur: np.ndarray, old: np.ndarray, gap: int) -> list[tuple[int, int]]:
    """The rule said plainly: each run of differing bytes, then runs whose changed bytes are at
    most `gap` apart joined."""
    runs: list[list[int]] = []
    for i in range(cur.size):
        if cur[i] != old[i]:
            if runs and i - runs[-1][1] + 1 <= gap:
                runs[-1][1] = i + 1
            else:
                runs.append([i, i + 1])
    return [tuple(r) for r in runs]


@pytest.mark.parametrize("small", [0, pools.SMALL_RUNS], ids=["by_words", "small_by_bytes"])
@pytest.mark.parametrize("gap", [16, 17, 64, 200])
def test_changed_runs_equal_a_byte_walk(gap, small, monkeypatch):
    monkeypatch.setattr(pools, "SMALL_RUNS", small)
    rng = np.random.default_rng(gap)
    for _ in range(400):
        n, at = int(rng.integers(0, 400)), int(rng.integers(0, 9))  # any length, any alignment
        old = rng.integers(0, 256, n + at, dtype=np.uint8)
        cur = old.copy()
        for _ in range(int(rng.integers(0, 6))):
            a = int(rng.integers(at, n + at + 1))
            b = min(n + at, a + int(rng.integers(0, 90)))
            cur[a:b] ^= rng.integers(0, 2, b - a, dtype=np.uint8)  # some bytes of it change
        if int(rng.integers(0, 4)) == 0:  # now and then most bytes change (more than 64)
            cur[at:] ^= rng.integers(1, 256, n, dtype=np.uint8) * (rng.random(n) < 0.7)
        starts, ends = changed_runs(cur[at:], old[at:], gap)
        assert list(zip(starts.tolist(), ends.tolist())) == runs_byte_by_byte(cur[at:], old[at:], gap)
        # against zeros, given as None (a shadow known to be zeros, not read)
        sparse = cur[at:] * (rng.random(n) < 0.05).astype(np.uint8)
        starts, ends = changed_runs(sparse, None, gap)
        assert list(zip(starts.tolist(), ends.tolist())) == \
            runs_byte_by_byte(sparse, np.zeros(n, np.uint8), gap)
