#!/usr/bin/env python3
"""ctest gpu_check_decisions: bench/gpu/decisions.py's rules on hand-made results, each verdict
worked out by hand from the figures written here (steps in ms; 0.5 % the least saving that
counts as faster)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench",
                                "gpu"))
import decisions as d  # noqa: E402

ALL_PASS = ("kernels-wgmma=pass model-wgmma=pass kernels-wgmma-attn=pass model-wgmma-attn=pass "
            "kernels-wgmma4=pass kernels-wgmma3w0=pass kernels=pass model=pass model-router=pass "
            "kernels-pdl=pass model-pdl=pass")


def by(pairs):
    return {name: {"step_seconds": ms / 1e3} for name, ms in pairs}


def line(lines, start):
    found = [x for x in lines if x.startswith("- " + start)]
    assert len(found) == 1, (start, lines)
    return found[0]


class TestStatus(unittest.TestCase):
    def test_statuses(self):
        t = ("model-router=FAIL(no test case selected) kernels=pass(listed only) "
             "model=SKIPPED(deadline) nccl=FAIL(rc 1) memcheck(kernels)=exit 0")
        self.assertEqual(d.test_status(t, "model-router"), "fail")
        self.assertEqual(d.test_status(t, "kernels"), "pass")
        self.assertEqual(d.test_status(t, "model"), "skipped")
        self.assertEqual(d.test_status(t, "nccl"), "fail")
        self.assertEqual(d.test_status(t, "kernels-pdl"), "not run")
        # A name that is the start of another is not it.
        self.assertEqual(d.test_status("kernels-wgmma4=pass", "kernels-wgmma"), "not run")


class TestOptionRules(unittest.TestCase):
    def pdl(self, tests, b8, b32):
        return line(d.decisions(b8, b32, tests), "launch=pdl")

    def test_faster_at_both_batches_with_tests_passed_is_yes(self):
        # dense 20.0 -> 19.8 (1.0 % saved), MoE 10.0 -> 9.9 (1.0 %) at 8; 80 -> 78.4 (2.0 %),
        # 40 -> 39.6 (1.0 %) at 32.
        b8 = by([(d.DENSE, 20.0), (d.DENSE + "-pdl", 19.8), (d.MOE, 10.0), (d.MOE + "-pdl", 9.9)])
        b32 = by([(d.DENSE, 80.0), (d.DENSE + "-pdl", 78.4), (d.MOE, 40.0), (d.MOE + "-pdl", 39.6)])
        out = self.pdl(ALL_PASS, b8, b32)
        self.assertIn("**yes**", out)
        self.assertIn("batch 8: 19.80 against 20.00 ms (+1.0 %)", out)
        self.assertIn("batch 32: 78.40 against 80.00 ms (+2.0 %)", out)
        self.assertIn("batch 32: 39.60 against 40.00 ms (+1.0 %)", out)

    def test_under_half_a_percent_is_not_faster(self):
        # MoE at 32: 40.0 -> 39.9 saves 0.25 %: under the 0.5 %.
        b8 = by([(d.DENSE, 20.0), (d.DENSE + "-pdl", 19.8), (d.MOE, 10.0), (d.MOE + "-pdl", 9.9)])
        b32 = by([(d.DENSE, 80.0), (d.DENSE + "-pdl", 79.0), (d.MOE, 40.0), (d.MOE + "-pdl", 39.9)])
        out = self.pdl(ALL_PASS, b8, b32)
        self.assertIn("**no**: not faster by 0.5 % (MoE at batch 32)", out)

    def test_a_failed_test_is_no_whatever_the_times(self):
        b8 = by([(d.DENSE, 20.0), (d.DENSE + "-pdl", 10.0), (d.MOE, 10.0), (d.MOE + "-pdl", 5.0)])
        out = self.pdl(ALL_PASS.replace("model-pdl=pass", "model-pdl=FAIL(rc 1)"), b8, b8)
        self.assertIn("**no**: its tests failed (model-pdl)", out)

    def test_a_batch_not_measured_or_a_test_not_run_is_undecided(self):
        b8 = by([(d.DENSE, 20.0), (d.DENSE + "-pdl", 19.0), (d.MOE, 10.0), (d.MOE + "-pdl", 9.0)])
        self.assertIn("undecided (a batch not measured)", self.pdl(ALL_PASS, b8, None))
        out = self.pdl(ALL_PASS.replace("kernels-pdl=pass", ""), b8, b8)
        self.assertIn("undecided (tests kernels-pdl not passed)", out)

    def test_router_and_experts_read_their_own_points_and_tests(self):
        b = by([(d.MOE, 10.0), (d.MOE + "-router-tiled", 9.7), (d.WGMMA_MOE, 10.2)])
        lines = d.decisions(b, b, ALL_PASS)
        self.assertIn("**yes**", line(lines, "router=tiled"))  # 3 % saved at both
        self.assertIn("**no**: not faster", line(lines, "experts=wgmma"))  # 2 % slower
        lines = d.decisions(b, b, ALL_PASS.replace("model-router=pass", "model-router=FAIL(rc 2)"))
        self.assertIn("**no**: its tests failed (model-router)", line(lines, "router=tiled"))


class TestChosenKernels(unittest.TestCase):
    def test_the_spec_holds_the_options_decided_yes_and_the_pipeline_only_with_wgmma(self):
        w4 = d.WGMMA_MOE.replace("-wgmma-", "-wgmma4-")
        w3w0 = d.WGMMA_MOE.replace("-wgmma-", "-wgmma3w0-")
        # router 3 % faster, wgmma experts 5 % faster (4 stages fastest: 9.0 ms), pdl 2 % slower
        # for MoE, wgmma attention 2 % faster for both; at both batches.
        b = by([(d.DENSE, 20.0), (d.DENSE + "-pdl", 19.0), (d.MOE, 10.0), (d.MOE + "-pdl", 10.2),
                (d.MOE + "-router-tiled", 9.7), (d.WGMMA_MOE, 9.5), (w4, 9.0), (w3w0, 9.4),
                ("dense-124M-fused-wgmma-attn-adamw-beside", 19.6),
                ("moe-ra0.2-tiled128-fused-wgmma-attn-adamw-beside", 9.8)])
        _, spec, stages = d.decide(b, b, ALL_PASS)
        self.assertEqual(spec, "router=tiled,experts=wgmma,attention=fused_wgmma")
        self.assertEqual(stages, "4")
        # The experts' wgmma test failed: not that option, nor its pipeline; attention's stays.
        failed = ALL_PASS.replace("model-wgmma=pass", "model-wgmma=FAIL(rc 1)")
        _, spec, stages = d.decide(b, b, failed)
        self.assertEqual((spec, stages), ("router=tiled,attention=fused_wgmma", ""))
        # Attention's kernels hung (its model test then not run): the experts' option stays.
        hung = ALL_PASS.replace("kernels-wgmma-attn=pass", "kernels-wgmma-attn=FAIL(rc 124)") \
            .replace("model-wgmma-attn=pass", "model-wgmma-attn=SKIPPED(kernels-wgmma-attn hung)")
        _, spec, stages = d.decide(b, b, hung)
        self.assertEqual((spec, stages), ("router=tiled,experts=wgmma", "4"))
        # Nothing measured: nothing chosen.
        self.assertEqual(d.decide(None, None, "")[1:], ("", ""))


class TestOtherRules(unittest.TestCase):
    def test_pipeline_keeps_the_fastest_that_passed(self):
        w4 = d.WGMMA_MOE.replace("-wgmma-", "-wgmma4-")
        w3w0 = d.WGMMA_MOE.replace("-wgmma-", "-wgmma3w0-")
        b8 = by([(d.WGMMA_MOE, 10.0), (w4, 9.5), (w3w0, 9.0)])
        self.assertIn("keep **3w0**", line(d.decisions(b8, None, ALL_PASS), "wgmma pipeline"))
        # 3w0's test failed: the fastest of the rest (4), said to be of those timed only.
        out = line(d.decisions(b8, None, ALL_PASS.replace("kernels-wgmma3w0=pass",
                                                           "kernels-wgmma3w0=FAIL(rc 1)")),
                   "wgmma pipeline")
        self.assertIn("fastest of those timed: 4", out)

    def test_norm_beside_kept_unless_slower_by_half_a_percent(self):
        after = lambda n: n + "-norm-after"  # noqa: E731
        # dense 20.2 beside against 20.0 after: 1 % slower; MoE 10.02 against 10.0: 0.2 %.
        b8 = by([(d.DENSE, 20.2), (after(d.DENSE), 20.0), (d.MOE, 10.02), (after(d.MOE), 10.0)])
        self.assertIn("**no**: beside is slower for dense", line(d.decisions(b8, None, ""),
                                                                   "gradient norm"))
        b8 = by([(d.DENSE, 20.02), (after(d.DENSE), 20.0), (d.MOE, 10.0), (after(d.MOE), 10.1)])
        self.assertIn("keep beside", line(d.decisions(b8, None, ""), "gradient norm"))

    def test_host_bound_device_bound_or_mixed(self):
        def host(wait_ms):
            b8 = {d.MOE: {"step_seconds": 0.010, "host_wait_seconds": wait_ms / 1e3}}
            return line(d.decisions(b8, None, ""), "the MoE step's bound")
        self.assertIn("**the host**", host(0.5))      # 5 % of 10 ms
        self.assertIn("**the device**", host(7.0))    # 70 %
        self.assertIn("mixed", host(3.0))             # 30 %
        self.assertIn("undecided", line(d.decisions(None, None, ""), "the MoE step's bound"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
