"""The decisions a GPU run is for, read from its results (bench/gpu/NOTES.md, "The next GPU
session"): which option `auto` should take, which wgmma pipeline to keep, whether the step is
bound by the host. write_results.py prints them at the end of results.md, where the device
tool's output tail shows them.

Each rule is the notes' own: an option becomes `auto`'s only where its tests passed and it is
faster at each batch measured, both batches required. "Faster" means at least MIN_SAVED of the
step saved: a margin for the noise between points timed in different processes (not measured; the
GEMM ceiling alone differed by 2 % between two processes of one run on an H200). The verdict is a
suggestion with its figures; the session makes the change.
"""

MIN_SAVED = 0.005  # 0.5 % of the step

DENSE = "dense-124M-fused-mma-lean-attn-adamw-beside"  # the goals' points, as `moeplan run` runs
MOE = "moe-ra0.2-tiled128-fused-mma-lean-attn-adamw-beside"
WGMMA_MOE = "moe-ra0.2-wgmma-fused-mma-lean-attn-adamw-beside"


def test_status(tests, name):
    """'pass', 'fail', 'skipped' or 'not run', from gpu-check's "name=status ..." string."""
    for word in tests.split():
        if "=" not in word:
            continue
        k, v = word.split("=", 1)
        if k == name:
            return "pass" if v.startswith("pass") else "fail" if v.startswith("FAIL") else "skipped"
    return "not run"


def saved(by, option, base):
    """The share of base's step the option saves (negative: slower), or None if either is
    missing."""
    if not by or option not in by or base not in by:
        return None
    to, tb = by[option]["step_seconds"], by[base]["step_seconds"]
    return (tb - to) / tb


def figure(by, option, base, batch):
    s = saved(by, option, base)
    if s is None:
        return f"batch {batch}: not measured"
    return (f"batch {batch}: {1e3 * by[option]['step_seconds']:.2f} against "
            f"{1e3 * by[base]['step_seconds']:.2f} ms ({100 * s:+.1f} %)")


def option_rule(title, change, pairs, needed_tests, tests, by8, by32, b2=32):
    """One option against its base point(s) at both batches: 'yes' if its tests passed and each
    pair saves at least MIN_SAVED at each batch; 'no' if a test failed or a pair is not faster;
    'undecided' if something was not run. Returns (verdict, line)."""
    failed = [t for t in needed_tests if test_status(tests, t) == "fail"]
    missing = [t for t in needed_tests if test_status(tests, t) != "pass" and t not in failed]
    figs, slower, unmeasured = [], [], False
    for label, option, base in pairs:
        parts = []
        for batch, by in ((8, by8), (b2, by32)):
            s = saved(by, option, base)
            parts.append(figure(by, option, base, batch))
            if s is None:
                unmeasured = True
            elif s < MIN_SAVED:
                slower.append(f"{label} at batch {batch}")
        figs.append(f"{label}: " + "; ".join(parts))
    if failed:
        kind, verdict = "no", f"**no**: its tests failed ({', '.join(failed)})"
    elif slower:
        kind, verdict = "no", f"**no**: not faster by {100 * MIN_SAVED:.1f} % ({', '.join(slower)})"
    elif missing or unmeasured:
        what = ([f"tests {', '.join(missing)} not passed"] if missing else []) + (
            ["a batch not measured"] if unmeasured else [])
        kind, verdict = "undecided", f"undecided ({'; '.join(what)})"
    else:
        kind, verdict = "yes", f"**yes**: {change}"
    return kind, f"- {title}: {verdict}. " + ". ".join(figs) + "."


def pipeline_rule(tests, by8):
    """The wgmma experts' pipeline to keep as pipeline()'s default: the fastest at batch 8 of
    those whose kernel test passed. Returns (MOEPLAN_WGMMA_STAGES's value for it, "" for the
    default or when not all three were timed, line)."""
    cands = [("3 (the default)", "kernels-wgmma", WGMMA_MOE),
             ("4", "kernels-wgmma4", WGMMA_MOE.replace("-wgmma-", "-wgmma4-")),
             ("3w0", "kernels-wgmma3w0", WGMMA_MOE.replace("-wgmma-", "-wgmma3w0-"))]
    timed = [(label, by8[name]["step_seconds"]) for label, test, name in cands
             if by8 and name in by8 and test_status(tests, test) == "pass"]
    if not timed:
        return "", ("- wgmma pipeline (MOEPLAN_WGMMA_STAGES): undecided (none passed its test and "
                    "was timed).")
    best = min(timed, key=lambda x: x[1])
    figs = ", ".join(f"{label} {1e3 * t:.2f} ms" for label, t in timed)
    if len(timed) < len(cands):
        return "", (f"- wgmma pipeline (MOEPLAN_WGMMA_STAGES): fastest of those timed: {best[0]} "
                    f"(batch 8: {figs}; the others did not pass their tests or were not timed).")
    stages = "" if best[0].startswith("3 ") else best[0]
    return stages, (f"- wgmma pipeline (MOEPLAN_WGMMA_STAGES): keep **{best[0]}** as pipeline()'s "
                    f"default, drop the others (batch 8: {figs}).")


def norm_rule(by8):
    """The gradient norm summed beside the backward (the default since 2026-12-05) against after
    it: keep beside unless it is slower by MIN_SAVED for either point."""
    pairs = (("dense", DENSE), ("MoE", MOE))
    figs, slower = [], []
    for label, name in pairs:
        s = saved(by8, name, name + "-norm-after")
        figs.append(f"{label}: " + figure(by8, name, name + "-norm-after", 8))
        if s is not None and s < -MIN_SAVED:
            slower.append(label)
    if all(saved(by8, n, n + "-norm-after") is None for _, n in pairs):
        verdict = "undecided (not measured)"
    elif slower:
        verdict = (f"**no**: beside is slower for {', '.join(slower)}; set_norm_overlap's "
                   "default back to after")
    else:
        verdict = "keep beside (not slower by 0.5 %)"
    return f"- gradient norm beside the backward: {verdict}. " + ". ".join(figs) + "."


def host_rule(by8):
    """Where the MoE goal point's step is bound, from its host's waits at batch 8."""
    p = (by8 or {}).get(MOE)
    if not p or "host_wait_seconds" not in p:
        return "- the MoE step's bound: undecided (no host figures at batch 8)."
    share = p["host_wait_seconds"] / p["step_seconds"]
    if share < 0.1:
        verdict = ("**the host** (it waits for the device about never): fewer or cheaper launches "
                   "next (CUDA graphs of a pass, grouping the small products)")
    elif share > 0.5:
        verdict = ("**the device** (the host waits most of the step): faster kernels next; the "
                   "small products' ~12 µs are theirs")
    else:
        verdict = "mixed (neither waits most of the step): both matter"
    return (f"- the MoE step's bound at batch 8: {verdict}. Host waiting "
            f"{1e3 * p['host_wait_seconds']:.2f} of {1e3 * p['step_seconds']:.2f} ms "
            f"({100 * share:.0f} %).")


def decide(by8, by32, tests, b2=32):
    """The decision lines (markdown), and the kernels they choose: (lines, spec, stages), spec in
    `moeplan run --kernels` syntax for the options decided yes ("" if none), stages the wgmma
    pipeline's MOEPLAN_WGMMA_STAGES ("" for the default). by8, by32: {point name: bench_gpu
    point} at batch 8 and at the second batch, b2 (None where not run); tests: gpu-check's test
    statuses."""
    options = [
        ("launch=pdl", option_rule(
            "launch=pdl", "switch on `pdl` in kAutoMeasured (backend/include/moeplan/backend/"
            "cuda/model.hpp; the host test's auto expectations; docs/running.md)",
            [("dense", DENSE + "-pdl", DENSE), ("MoE", MOE + "-pdl", MOE)],
            ["kernels-pdl", "model-pdl"], tests, by8, by32, b2)),
        ("router=tiled", option_rule(
            "router=tiled", "switch on `tiled_router` in kAutoMeasured (backend/include/moeplan/"
            "backend/cuda/model.hpp; the host test's auto expectations; docs/running.md)",
            [("MoE", MOE + "-router-tiled", MOE)], ["model-router"], tests, by8, by32, b2)),
        ("experts=wgmma", option_rule(
            "experts=wgmma", "switch on `wgmma_experts` in kAutoMeasured (backend/include/moeplan/"
            "backend/cuda/model.hpp; the host test's auto expectations; docs/running.md)",
            [("MoE", WGMMA_MOE, MOE)], ["kernels-wgmma", "model-wgmma"], tests, by8, by32, b2)),
        ("attention=fused_wgmma", option_rule(
            "attention=fused_wgmma",
            "switch on `wgmma_attention` in kAutoMeasured (backend/include/moeplan/backend/cuda/"
            "model.hpp; the host test's auto expectations; docs/running.md), if "
            "kernel-times-wgmma-attn-vs-lean.md agrees kernel by kernel",
            [("dense", "dense-124M-fused-wgmma-attn-adamw-beside", DENSE),
             ("MoE", "moe-ra0.2-tiled128-fused-wgmma-attn-adamw-beside", MOE)],
            ["kernels-wgmma-attn", "model-wgmma-attn"], tests, by8, by32, b2)),
    ]
    stages, pipeline_line = pipeline_rule(tests, by8)
    lines = [line for _, (_, line) in options[:3]] + [pipeline_line, options[3][1][1],
                                                      norm_rule(by8), host_rule(by8)]
    chosen = [spec for spec, (kind, _) in options if kind == "yes"]
    experts_yes = options[2][1][0] == "yes"
    return lines, ",".join(chosen), stages if experts_yes else ""


def decisions(by8, by32, tests, b2=32):
    """The decision lines, markdown (decide's first part)."""
    return decide(by8, by32, tests, b2)[0]
