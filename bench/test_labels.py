#!/usr/bin/env python3
"""Unit test of bench/labels.py (make test-unit): a "first load" whose storage served a few KB of a
32 MB pool (what `bench/run --quick` recorded for repetitions 2 and 3 before the caches were emptied
between runs) is refused; honest first and repeat runs pass."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import labels  # noqa: E402

S = 32 * 1000 * 1000
cached_first = {"section": "fig11", "method": "swpool-load-sqfs", "n": 2, "rep": 2, "storage_bytes": 20_480}
real_first = {"section": "fig11", "method": "swpool-load-sqfs", "n": 2, "rep": 1, "storage_bytes": 32_150_000}
real_repeat = {"section": "fig11-repeat", "method": "swpool-load-sqfs", "n": 2, "rep": 3, "storage_bytes": 9_000}
uncached_repeat = {"section": "fig11-repeat", "method": "swpool-cp", "n": 4, "rep": 3, "storage_bytes": S}
other = {"section": "fig11", "method": "sbcast", "n": 2, "rep": 1, "storage_bytes": 0}

assert "already on the nodes" in (labels.check(cached_first, S) or ""), labels.check(cached_first, S)
assert labels.check(real_first, S) is None
assert labels.check(real_repeat, S) is None
assert "did not find" in (labels.check(uncached_repeat, S) or "")
assert labels.check(other, S) is None
print("bench/test_labels.py: 5 passed, 0 failed")
