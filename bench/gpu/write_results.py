#!/usr/bin/env python3
"""gpu-check's results table: results.md from what a check left in its work folder.

    write_results.py OUT MACHINE TESTS [BATCH2]

OUT holds bench_gpu's JSON files (bench*.json), PyTorch's (torch*.json) and gemm-shapes.txt;
MACHINE is nvidia-smi's line; TESTS the test steps' statuses ("name=pass ..."); BATCH2 the
second batch, if one was run. Prints markdown on stdout. Run by scripts/gpu-check after every
step (cheap), so that a call killed at its limit still returns a table.
"""
import json, sys, os, datetime
from decisions import DENSE, MIN_SAVED, MOE, decide  # beside this file (sys.path[0])
out, machine, tests, b2 = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
def load(n):
    try:
        return json.load(open(os.path.join(out, n)))
    except Exception:
        return None
def load_bench(n):
    # A bench_gpu file, each point given the ceiling its own process measured (bench_gpu writes
    # it once, at the top; the merged files are separate processes: 769 and 786 TFLOP/s on one
    # H200 in one run).
    b = load(n)
    for p in (b or {}).get("points", []):
        p.setdefault("gemm_ceiling_tflops", b["gemm_ceiling_tflops"])
    return b
def counts(t):
    # How PyTorch was timed: torch_ref.py writes its counts, a file from before it did has none
    # (gpu-check runs bench_gpu at its default, 20 steps after 5).
    if t and "steps" in t and "warmup" in t:
        return f"PyTorch timed over {t['steps']} steps after {t['warmup']} warm-up"
    return "PyTorch step counts not recorded"
print(f"# GPU check, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC\n")
print(f"machine: {machine}  \nGPU tests:{tests}\n")
def text(n):
    try:
        return open(os.path.join(out, n), encoding="utf-8").read()
    except Exception:
        return None
def sweep_section():
    # The equal-time sweep (gpu-check's part sweep): the plan, the --estimate's projection, then
    # `moeplan report`'s tables of what was trained, its headings one level down.
    manifest = text("sweep.toml")
    if manifest is None:
        return
    made = next((l.split("=", 1)[1].strip().strip('"') for l in manifest.splitlines()
                 if l.startswith("created_by")), "moeplan grid (command not recorded)")
    print(f"\n## Equal time: the sweep `{made.split(' -o ')[0]}`, trained with `moeplan run`\n")
    est = text("sweep-estimate.txt") or ""
    lines = [l for l in est.splitlines()
             if "estimate" in l or "projected" in l or "error" in l or "already complete" in l]
    if lines:
        print("The estimate before training (`--estimate 10`):\n")
        print("\n".join("    " + l for l in lines))
        print()
    rep = text("sweep-report.md")
    if rep is None:
        print("No report: nothing trained, or `moeplan report` failed (sweep-report.txt, "
              "sweep-run.log and sweep-estimate.txt in logs.tar.gz).\n")
        return
    body = rep.split("\n", 1)[1] if rep.startswith("# ") else rep
    print(body.replace("\n## ", "\n### ").rstrip() + "\n")
# A call that ran the sweep alone (GPU_CHECK_ONLY=sweep) has no benchmark and no test to table,
# and no decision to make.
if not tests.strip() and not any(n.startswith("bench") and n.endswith(".json") for n in os.listdir(out)):
    sweep_section()
    print("\nNo benchmark and no GPU test ran in this call, so it decides nothing.")
    with open(os.path.join(out, "decided-kernels.txt"), "w", encoding="utf-8") as f:
        f.write("\n\n")
    sys.exit(0)
def table(b, t):
    if not b:
        print("benchmark: no results (see bench.txt)\n")
        return
    ceilings = sorted({p["gemm_ceiling_tflops"] for p in b["points"]})
    print(f"bf16 GEMM ceiling (cuBLAS 8192^3, measured by each benchmark process; MFU vs ceiling "
          f"is against a point's own): {', '.join(f'{c:.1f}' for c in ceilings)} TFLOP/s; "
          f"vendor peak {b['peak_tflops']:.0f}; batch {b['batch_seqs']} x 1024 tokens\n")
    tp = {p["name"]: p for p in (t or {}).get("points", [])}
    print("| model | N non-emb | N_a | step ms | tokens/s (consumed) | TFLOP/s exact/causal | "
          "TFLOP/s executed | MFU vs peak | MFU vs ceiling | torch eager tokens/s | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for p in b["points"]:
        r = tp.get("dense-124M" if p["name"].startswith("dense") else "moe-ra0.2")  # same shapes
        peak = b["peak_tflops"]
        mfu = f"{100 * p['tflops_exact_causal'] / peak:.1f}%" if peak else "n/a"
        ts = f"{r['tokens_per_second_consumed']:.0f}" if r else "n/a"
        ratio = f"{p['tokens_per_second_consumed'] / r['tokens_per_second_consumed']:.2f}x" if r else "n/a"
        print(f"| {p['name']} | {p['total_params']/1e6:.1f}M | {p['active_params']/1e6:.1f}M | "
              f"{1e3 * p['step_seconds']:.1f} | {p['tokens_per_second_consumed']:.0f} | "
              f"{p['tflops_exact_causal']:.1f} | {p['tflops_executed']:.1f} | {mfu} | "
              f"{100 * p['tflops_exact_causal'] / p['gemm_ceiling_tflops']:.1f}% | {ts} | {ratio} |")
    if t:
        print(f"\ntorch {t['torch']} eager, bf16 autocast, SDPA attention, same shapes/batch/data; "
              f"{counts(t)}.\n")
    # The host's side of each step (bench_gpu, since 2026-12-05 sixth session): its own work and
    # its waits for the device. A wait near zero: the device waited for the host. waits: its
    # synchronous calls a step (since 2026-12-06; 8 for the goals' points as moeplan run trains
    # them, by bench_launches_emulated and the model test "a step's host waits").
    host = [p for p in b["points"] if "host_busy_seconds" in p]
    if host:
        print("\nThe host per step (medians): its own work (issuing launches) and its waits for "
              "the device; a point whose host waits about nothing is bound by the host, not the "
              "device.\n")
        print("| point | step ms | host busy ms | host waiting ms | busy share | waits |")
        print("|---|---|---|---|---|---|")
        for p in host:
            st, hb = p["step_seconds"], p["host_busy_seconds"]
            print(f"| {p['name']} | {1e3 * st:.2f} | {1e3 * hb:.2f} | "
                  f"{1e3 * p['host_wait_seconds']:.2f} | {100 * hb / st:.0f}% | "
                  f"{p.get('host_waits_per_step', '—')} |")
        print()
main = None
for n in ("bench.json", "bench-new.json", "bench-wgmma.json", "bench-wgmma4.json",
          "bench-wgmma3w0.json", "bench-wgmma-attn.json", "bench-pdl.json", "bench-router.json",
          "bench-none.json",
          "bench-opt.json", "bench-lt.json", "bench-best.json"):
    part = load_bench(n)
    if part and main:
        main["points"] += part["points"]
    elif part:
        main = part
table(main, load("torch.json"))
# Which kernels were fastest, one pass a step and the automatic LM-head chunk (the candidates for
# the defaults in backend/include/moeplan/backend/cuda/model.hpp).
if main:
    for family in ("dense", "moe"):
        pts = [p for p in main["points"] if p["name"].startswith(family) and "kernels" in p
               and p.get("micro_batch", 0) == 0 and "logits" not in p["name"]
               and "capacity" not in p["name"] and "erc" not in p["name"]]
        if pts:
            best = min(pts, key=lambda p: p["step_seconds"])
            print(f"fastest {family} kernels: {best['kernels']} ({best['name']}, "
                  f"{1e3 * best['step_seconds']:.1f} ms a step)  ")
    print()
    # The options built without a GPU, each against the same point without it (same run).
    by = {p["name"]: p for p in main["points"]}
    for what, opt, base in (
            ("MoE shared expert beside the routed part (on by default)",
             "moe-ra0.2-tiled-fused-mma-attn", "moe-ra0.2-tiled-fused-mma-attn-serial-shared"),
            ("dense weight gradients beside (set_weight_grad_overlap)",
             "dense-124M-fused-mma-attn-wgrad-beside", "dense-124M-fused-mma-attn"),
            ("MoE weight gradients beside (set_weight_grad_overlap)",
             "moe-ra0.2-tiled-fused-mma-attn-wgrad-beside", "moe-ra0.2-tiled-fused-mma-attn"),
            ("MoE with capacity factor 1.25 (a host wait a MoE layer; drops)",
             "moe-ra0.2-tiled-fused-mma-attn-capacity-1.25", "moe-ra0.2-tiled-fused-mma-attn"),
            ("MoE with the ERC loss (fp32 products, once a step)",
             "moe-ra0.2-tiled-fused-mma-attn-erc", "moe-ra0.2-tiled-fused-mma-attn"),
            ("dense forward at 32 query rows a warp (attention=fused_mma_wide)",
             "dense-124M-fused-mma-wide-attn", "dense-124M-fused-mma-attn"),
            ("MoE forward at 32 query rows a warp (attention=fused_mma_wide)",
             "moe-ra0.2-tiled-fused-mma-wide-attn", "moe-ra0.2-tiled-fused-mma-attn"),
            ("dense products by the tuned GEMM table (gemm-table.json)",
             "dense-124M-fused-mma-attn-lt-table", "dense-124M-fused-mma-attn"),
            ("MoE products by the tuned GEMM table (gemm-table.json)",
             "moe-ra0.2-tiled-fused-mma-attn-lt-table", "moe-ra0.2-tiled-fused-mma-attn"),
            ("dense goal point with the built-in GEMM table (gemm=auto) against none",
             "dense-124M-fused-mma-lean-attn-adamw-beside",
             "dense-124M-fused-mma-lean-attn-adamw-beside-no-gemm-table"),
            ("MoE goal point with the built-in GEMM table (gemm=auto) against none",
             "moe-ra0.2-tiled128-fused-mma-lean-attn-adamw-beside",
             "moe-ra0.2-tiled128-fused-mma-lean-attn-adamw-beside-no-gemm-table"),
            ("dense goal point, the gradient norm summed beside the backward against after",
             "dense-124M-fused-mma-lean-attn-adamw-beside",
             "dense-124M-fused-mma-lean-attn-adamw-beside-norm-after"),
            ("MoE goal point, the gradient norm summed beside the backward against after",
             "moe-ra0.2-tiled128-fused-mma-lean-attn-adamw-beside",
             "moe-ra0.2-tiled128-fused-mma-lean-attn-adamw-beside-norm-after"),
            ("MoE goal point with the wgmma expert kernels against tiled128",
             "moe-ra0.2-wgmma-fused-mma-lean-attn-adamw-beside",
             "moe-ra0.2-tiled128-fused-mma-lean-attn-adamw-beside"),
            ("MoE goal point, wgmma at 4 stages (MOEPLAN_WGMMA_STAGES=4) against 3",
             "moe-ra0.2-wgmma4-fused-mma-lean-attn-adamw-beside",
             "moe-ra0.2-wgmma-fused-mma-lean-attn-adamw-beside"),
            ("MoE goal point, wgmma at 3 stages two steps ahead (MOEPLAN_WGMMA_STAGES=3w0) "
             "against one ahead",
             "moe-ra0.2-wgmma3w0-fused-mma-lean-attn-adamw-beside",
             "moe-ra0.2-wgmma-fused-mma-lean-attn-adamw-beside"),
            ("dense goal point with wgmma attention (attention=fused_wgmma) against lean",
             "dense-124M-fused-wgmma-attn-adamw-beside",
             "dense-124M-fused-mma-lean-attn-adamw-beside"),
            ("MoE goal point with wgmma attention (attention=fused_wgmma) against lean",
             "moe-ra0.2-tiled128-fused-wgmma-attn-adamw-beside",
             "moe-ra0.2-tiled128-fused-mma-lean-attn-adamw-beside"),
            ("MoE goal point with both wgmma paths against the defaults",
             "moe-ra0.2-wgmma-fused-wgmma-attn-adamw-beside",
             "moe-ra0.2-tiled128-fused-mma-lean-attn-adamw-beside"),
            ("dense goal point with programmatic dependent launches (launch=pdl) against plain",
             "dense-124M-fused-mma-lean-attn-adamw-beside-pdl",
             "dense-124M-fused-mma-lean-attn-adamw-beside"),
            ("MoE goal point with programmatic dependent launches (launch=pdl) against plain",
             "moe-ra0.2-tiled128-fused-mma-lean-attn-adamw-beside-pdl",
             "moe-ra0.2-tiled128-fused-mma-lean-attn-adamw-beside"),
            ("dense, wgmma attention, launch=pdl against plain",
             "dense-124M-fused-wgmma-attn-adamw-beside-pdl",
             "dense-124M-fused-wgmma-attn-adamw-beside"),
            ("MoE, both wgmma paths, launch=pdl against plain",
             "moe-ra0.2-wgmma-fused-wgmma-attn-adamw-beside-pdl",
             "moe-ra0.2-wgmma-fused-wgmma-attn-adamw-beside"),
            ("MoE goal point with the router's products on the tiled kernels (router=tiled) "
             "against cuBLAS",
             "moe-ra0.2-tiled128-fused-mma-lean-attn-adamw-beside-router-tiled",
             "moe-ra0.2-tiled128-fused-mma-lean-attn-adamw-beside")):
        if opt in by and base in by:
            to, tb = by[opt]["step_seconds"], by[base]["step_seconds"]
            print(f"{what}: {1e3 * to:.2f} ms a step against {1e3 * tb:.2f} without "
                  f"({100 * (tb - to) / tb:+.1f} % of the step saved)  ")
    print()
def load_b2():
    # The points at the second batch, the wgmma experts' point there, and (GPU_CHECK_TUNE_GOALS)
    # the goals' points with the goals' table.
    merged = None
    for n in (f"bench-b{b2}.json", f"bench-b{b2}-wgmma.json", f"bench-b{b2}-wgmma-attn.json",
              f"bench-b{b2}-pdl.json", f"bench-b{b2}-router.json", f"bench-b{b2}-lt.json",
              f"bench-b{b2}-best.json"):
        part = load_bench(n)
        if part and merged:
            merged["points"] += part["points"]
        elif part:
            merged = part
    return merged
merged_b2 = load_b2() if b2 else None  # read once: the table, the goals and the decisions
if b2:
    table(merged_b2, load(f"torch-b{b2}.json"))
# The goals, for the default kernels (and the tuned GEMM table where it ran), at each
# batch measured: dense >= 40 % MFU, MoE >= 25 % (exact/causal FLOPs against the vendor peak),
# >= 1.5x PyTorch eager tokens/s.
goals = [("dense", DENSE, 40.0),
         ("moe", MOE, 25.0),
         ("moe", "moe-ra0.2-wgmma-fused-mma-lean-attn-adamw-beside", 25.0),
         ("moe", "moe-ra0.2-wgmma4-fused-mma-lean-attn-adamw-beside", 25.0),
         ("moe", "moe-ra0.2-wgmma3w0-fused-mma-lean-attn-adamw-beside", 25.0),
         ("dense", "dense-124M-fused-wgmma-attn-adamw-beside", 40.0),
         ("moe", "moe-ra0.2-tiled128-fused-wgmma-attn-adamw-beside", 25.0),
         ("moe", "moe-ra0.2-wgmma-fused-wgmma-attn-adamw-beside", 25.0),
         ("dense", "dense-124M-fused-mma-lean-attn-adamw-beside-pdl", 40.0),
         ("moe", "moe-ra0.2-tiled128-fused-mma-lean-attn-adamw-beside-pdl", 25.0),
         ("dense", "dense-124M-fused-wgmma-attn-adamw-beside-pdl", 40.0),
         ("moe", "moe-ra0.2-wgmma-fused-wgmma-attn-adamw-beside-pdl", 25.0),
         ("moe", "moe-ra0.2-tiled128-fused-mma-lean-attn-adamw-beside-router-tiled", 25.0)]
rows = []
for bench_name, torch_name in (("bench.json", "torch.json"),) + (
        ((f"bench-b{b2}.json", f"torch-b{b2}.json"),) if b2 else ()):
    b = main if bench_name == "bench.json" else merged_b2
    t = load(torch_name)
    if not b or not b.get("peak_tflops"):
        continue
    by = {p["name"]: p for p in b["points"]}
    tp = {p["name"]: p for p in (t or {}).get("points", [])}
    # The goals' points with the kernels a run's decisions chose (bench-best: NAME-with-SPEC).
    best = [("dense" if n.startswith("dense") else "moe", n, 40.0 if n.startswith("dense") else 25.0)
            for n in by if "-with-" in n and n.split("-with-")[0] in (DENSE, MOE)]
    for family, name, goal in goals + best:
        for n in (name, name + "-lt-table", name + "-no-gemm-table"):
            p = by.get(n)
            if not p:
                continue
            mfu = 100 * p["tflops_exact_causal"] / b["peak_tflops"]
            r = tp.get("dense-124M" if family == "dense" else "moe-ra0.2")
            ratio = p["tokens_per_second_consumed"] / r["tokens_per_second_consumed"] if r else None
            rows.append(f"| {n} | {b['batch_seqs']} | {1e3 * p['step_seconds']:.1f} | {mfu:.1f} % "
                        f"(goal {goal:.0f} %: {'met' if mfu >= goal else 'not met'}) | "
                        + (f"{ratio:.2f}x (goal 1.5x: {'met' if ratio >= 1.5 else 'not met'}; "
                           f"{counts(t)})" if ratio else "n/a") + " |")
if rows:
    print("\n## Against the goals\n")
    print("| point | batch (seqs of 1024) | step ms | MFU vs peak | vs PyTorch eager |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    print()
try:
    shapes = open(os.path.join(out, "gemm-shapes.txt")).read()
    print(shapes[shapes.index("\n| product"):])
except Exception:
    print("GEMM shapes: no results (see gemm-shapes.txt)")
sweep_section()
# The decisions the run is for (decisions.py, the rules of bench/gpu/NOTES.md), last, where the
# device tool's output tail shows them.
by8 = {p["name"]: p for p in main["points"]} if main else None
by32 = {p["name"]: p for p in merged_b2["points"]} if merged_b2 else None
print(f"\n## Decisions (bench/gpu/NOTES.md's rules; faster: {100 * MIN_SAVED:.1f} % of the step "
      f"saved at each batch, batch 8 and {b2 or 'a second batch (not run)'})\n")
lines, spec, stages = decide(by8, by32, tests, int(b2) if b2 else 32)
print("\n".join(lines))
print(f"\nThe kernels these choose: " + (f"`{spec}`" if spec else "none beyond the defaults")
      + (f", MOEPLAN_WGMMA_STAGES={stages}" if stages else "")
      + (" (bench-best times the goals' points with them: NAME-with-SPEC in the goals table)"
         if spec else ""))
# For gpu-check's bench-best step: the spec, then the pipeline (either line may be empty).
with open(os.path.join(out, "decided-kernels.txt"), "w", encoding="utf-8") as f:
    f.write(f"{spec}\n{stages}\n")
