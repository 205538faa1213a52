#!/usr/bin/python3
"""Smoke test of the scale model (make test-model, run by make test-unit): the model runs, the engine's
plan matches plan.rs, and the calibration stays within tolerance. Not a timing test. < 60 s."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from swpmodel import plan, run  # noqa: E402

# Rows the model is known not to reproduce (see model/README.md, "What the model misses"): the 4 MiB
# figures at N = 2, 4 (measured on a busy machine; the model has no mechanism for the slower rounds)
# and one MPI_Ibcast per reader at N = 8 (Open MPI's non-blocking broadcast over TCP is twice as slow as
# the model's binomial trees). The test fails if this set changes, in either direction.
# The ring with rounds capped at 1 or 2 chunks, 1 MiB chunks (bench/ring-slots.sh): the testbed's tbf lets
# an idle link send a 1 MB burst at once, so with rounds that leave most links idle a 1 MiB hop is far
# faster than the link rate; the model has no token bucket (with 4 MiB chunks it is within 5 %).
KNOWN_OUT = {("ring 4 MiB", 2), ("ring 4 MiB", 4), ("bcast 1 MiB", 8),
             ("ring 1 MiB, ≤ 1 per round", 8), ("ring 1 MiB, ≤ 2 per round", 8)}


class Plan(unittest.TestCase):
    def test_matches_plan_rs(self):
        # the constants plan.rs's unit test checks
        self.assertEqual(plan.slots_per_round(8, 4 << 20), 8)
        self.assertEqual(plan.round_buffers(8, 4 << 20), 3)
        self.assertEqual(plan.slots_per_round(100, 4 << 20), 18)
        self.assertEqual(plan.round_buffers(18, 4 << 20), 2)
        self.assertEqual(plan.slots_per_round(1024, 1 << 20), 78)
        self.assertEqual(plan.round_buffers(78, 1 << 20), 2)
        self.assertEqual(plan.ring_slots(1024), 1024)
        self.assertEqual(plan.ring_rounds_in_flight(1 << 20), 3)
        self.assertEqual(plan.ring_block_buffers(1 << 20), 156)
        self.assertEqual(plan.ring_rounds_in_flight(32 << 20), 1)
        self.assertEqual(plan.ring_block_buffers(32 << 20), 3)

    def test_rounds_cover_every_chunk_once(self):
        for count in (0, 1, 7, 31, 100):
            for owners in range(1, 9):
                for slots in (1, 2, owners, 16):
                    seen = sorted(c for r in plan.plan_rounds(count, owners, slots) for (_, c) in r)
                    self.assertEqual(seen, list(range(count)))


def _sim(*args, **kw):
    """One simulation in a child process (SimGrid's engine is one per process)."""
    return run.run_all([args + (kw,)])[0]


class Engine(unittest.TestCase):
    def test_zero_chunks_are_not_sent(self):
        p = run.platform("vc-links")
        dense = _sim(p, "ring", 4, 64 << 20, 1 << 20)
        half = _sim(p, "ring", 4, 64 << 20, 1 << 20, zero_fraction=0.5)
        # every chunk is still read from storage (1/4 of it per node), half of them are not sent
        self.assertLess(half, 0.8 * dense)

    def test_ring_rounds_carry_every_reader(self):
        # 16 MiB chunks: round buffers allowed 3 chunks per round at 8 nodes; the ring now takes 8
        p = run.platform("vc-links")
        self.assertEqual(run.plan.slots_per_round(8, 16 << 20), 3)
        before = _sim(p, "ring-round-buffers", 8, 256 << 20, 16 << 20)
        now = _sim(p, "ring", 8, 256 << 20, 16 << 20)
        self.assertLess(now, 0.9 * before, f"ring {now} vs round buffers {before}")

    def test_every_algorithm_runs(self):
        p = run.platform("vc-links")
        for algo in run.sim.ALGORITHMS + run.sim.BEFORE:
            t = _sim(p, algo, 4, 16 << 20, 1 << 20)
            self.assertTrue(t == t and 0 < t < 60, f"{algo}: {t}")


class Calibration(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cal = run.calibrate(quick=True)

    def test_within_tolerance(self):
        out = {(r["what"], r["n"]) for r in self.cal["rows"] if not run.in_tolerance(r)}
        for r in self.cal["rows"]:
            print(f"  {r['platform']:9s} {r['what']:26s} N={r['n']:<3d} measured {r['measured']:7.2f} "
                  f"model {r['model']:7.2f} {r['err'] * 100:+6.1f} %", file=sys.stderr)
        self.assertEqual(out, KNOWN_OUT)

    def test_ring_is_link_bound_below_8_nodes(self):
        rows = {(r["what"], r["n"]): r["model"] for r in self.cal["rows"]}
        for n in (1, 2, 4):
            self.assertLess(rows[("ring 1 MiB", n)], 1.1 * 1024 ** 3 / 47.9e6 + 1.5)


if __name__ == "__main__":
    res = unittest.main(exit=False, verbosity=1).result
    failed = len(res.failures) + len(res.errors)
    print(f"model tests: {res.testsRun - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
