#!/usr/bin/env python3
"""bench_gpu's stand-in for a dry run of scripts/gpu-check (GPU_CHECK_DRY; ctest gpu_check_dry).

Each call first goes to the real bench_gpu named by DRY_BENCH_REAL, which checks the options and
every --only name and, finding no GPU, exits 77 before measuring anything. Only then does this
write what bench_gpu would: the results table on stdout; each point's phases, kernels (with
--kernel-times), loss and host lines on stderr; and the --json file. Every figure is made up
(from the point's name, so the same each run) and says so; what a dry run checks is that the
calls, names, files and formats fit together, never a measurement.
"""
import json
import os
import re
import subprocess
import sys
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The kernel-times file whose sections stand in for each point's phases and kernels (run F).
TEMPLATE = os.path.join(ROOT, "bench", "gpu", "kernel-times-h200-2026-12-04-run-f.txt")


def real_check(argv):
    real = os.environ.get("DRY_BENCH_REAL", "")
    if not real or not os.access(real, os.X_OK):
        sys.exit(f"dry_bench.py: DRY_BENCH_REAL='{real}' is not an executable bench_gpu")
    r = subprocess.run([real] + argv, capture_output=True, text=True)
    if r.returncode != 77:  # 0 (--help, --list-points), 2 (refused), or a failure: as it said
        sys.stdout.write(r.stdout)
        sys.stderr.write(r.stderr)
        sys.exit(r.returncode)
    names = subprocess.run([real, "--list-points"], capture_output=True, text=True, check=True)
    return names.stdout.split()


def options(argv):
    o = {"batch": 8, "only": None, "json": None, "kernel_times": False, "gemm_shapes": False,
         "gemm_table": None, "gemm_tune": None, "kernels": None}
    i = 0
    while i < len(argv):
        k = argv[i]
        if k in ("--kernel-times", "--gemm-shapes"):
            o[k[2:].replace("-", "_")] = True
            i += 1
            continue
        v = argv[i + 1]  # bench_gpu has refused a flag without its value already
        if k == "--batch":
            o["batch"] = int(v)
        elif k == "--only":
            o["only"] = v.split(",")
        elif k in ("--json", "--gemm-table", "--gemm-tune", "--kernels"):
            o[k[2:].replace("-", "_")] = v
        i += 2
    return o


def sections(path):
    """{point: [lines]} of a kernel-times file: each point's phase and kernel tables."""
    out, point = {}, None
    for line in open(path, encoding="utf-8"):
        m = re.match(r"^\[([^\]]+)\] device time per step by (phase|kernel)", line)
        if m:
            point = m[1]
            out.setdefault(point, []).append(line)
        elif point and line.startswith("    "):
            out[point].append(line)
        else:
            point = None
    return out


def kernels_of(name, spec=None):
    att = ("fused_wgmma" if "fused-wgmma-attn" in name else
           "fused_mma_lean" if "fused-mma-lean-attn" in name else
           "fused_mma_wide" if "fused-mma-wide-attn" in name else
           "fused_mma" if "fused-mma-attn" in name else
           "fused" if "fused-attn" in name else "cublas")
    parts = name.split("-")
    part = parts[2] if name.startswith("moe-") and len(parts) > 2 else ""
    exp = next((e for e in ("wgmma", "tiled128", "tiled", "batched", "loop") if part.startswith(e)),
               "grouped")
    k = {"attention": att, "experts": exp, "launch": "pdl" if name.endswith("-pdl") else "",
         "router": "tiled" if name.endswith("-router-tiled") else ""}
    for item in (spec or "").split(","):  # --kernels: bench_gpu has checked it
        if item:
            key, value = item.split("=")
            k[key] = value
    return (f"attention={k['attention']},experts={k['experts']}"
            + (",launch=pdl" if k["launch"] == "pdl" else "")
            + (",router=tiled" if k["router"] == "tiled" else ""))


def options_in(kernels):
    """How many of the options built without a GPU a point's kernels use."""
    return sum(x in kernels for x in ("launch=pdl", "router=tiled", "experts=wgmma",
                                      "attention=fused_wgmma"))


def main():
    argv = sys.argv[1:]
    points = real_check(argv)
    o = options(argv)
    if o["gemm_tune"] or o["gemm_shapes"]:
        sys.exit("dry_bench.py: --gemm-tune and --gemm-shapes have no dry form (gpu-check's dry "
                 "run leaves them out)")
    batch = o["batch"]
    suffix = ("" if o["gemm_table"] in (None, "auto") else
              "-no-gemm-table" if o["gemm_table"] == "none" else "-lt-table")
    print("device: NVIDIA H200 (DRY RUN: no GPU; every figure below is made up), 132 SMs; vendor "
          "dense bf16 peak 989 TFLOP/s; measured bf16 GEMM ceiling (cuBLAS 8192^3, median of 10) "
          "700.0 TFLOP/s")
    print("| model | N (non-emb) | N_a | r_a | tokens/step | median step ms | ... (dry run) |")
    doc = {"device": "NVIDIA H200", "dry_run": True, "peak_tflops": 989,
           "gemm_ceiling_tflops": 700.0, "batch_seqs": batch, "points": []}
    template = sections(TEMPLATE)
    for name in (p for p in points if o["only"] is None or p in o["only"]):
        dense = name.startswith("dense")
        # Made up: about run H's step at batch 8, scaled with the batch, 3 % less for each option
        # the point uses (so that every option wins and every decision and the bench-best step
        # are exercised), 1 % more with the norm after, and moved by up to ±0.5 % by the name's
        # hash.
        kernels = kernels_of(name, o["kernels"])
        if o["kernels"]:
            name = f"{name}-with-{o['kernels']}"
        wobble = 0.995 + 0.01 * (zlib.crc32(name.encode()) % 1000) / 1000
        t = ((0.0214 if dense else 0.0137) * batch / 8 * wobble * (1 - 0.03 * options_in(kernels))
             * (1.01 if name.endswith("-norm-after") else 1))
        useful = (8.4513e12 if dense else 2.6710e12) * batch / 8  # exact/causal FLOPs a step
        full = name + suffix
        total, active = (123863040, 123863040) if dense else (120061952, 24117248)
        tokens = batch * 1024
        print(f"| {full} | {total / 1e6:.1f}M | {active / 1e6:.1f}M | {active / total:.3f} | "
              f"{tokens} | {1e3 * t:.2f} | (dry run) |")
        base = name if name in template else (
            "dense-124M-fused-mma-attn" if dense else "moe-ra0.2-tiled-fused-mma-attn")
        for line in template[base]:
            if "by kernel" in line and not o["kernel_times"]:
                break
            sys.stderr.write(line.replace(f"[{base}]", f"[{full}]", 1))
        sys.stderr.write(f"[{full}] loss 10.9000 -> 10.4000 over 25 steps (dry run)\n")
        sys.stderr.write(f"[{full}] host per step (medians): busy {0.3e3 * t:.2f} ms, waiting for "
                         f"the device {0.7e3 * t:.2f} ms in 8 synchronous calls, "
                         f"of {1e3 * t:.2f} ms\n")
        doc["points"].append({
            "name": full, "total_params": total, "active_params": active, "step_seconds": t,
            "tokens_per_second_consumed": tokens / t, "tflops_exact_causal": useful / t / 1e12,
            "tflops_executed": 1.03 * useful / t / 1e12, "kernels": kernels,
            "micro_batch": 2 if "passes-of-2" in name else 0,
            "logit_rows": 2048 if "logits-2048" in name else tokens,
            "gemm_table": "" if suffix else "builtin:h200-2026-12-04", "gemm_products": 0,
            "gemm_products_from_table": 0, "host_busy_seconds": 0.3 * t,
            "host_wait_seconds": 0.7 * t, "host_waits_per_step": 8})
        if o["json"]:
            tmp = o["json"] + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(doc, f)
            os.replace(tmp, o["json"])
    if o["json"] and not doc["points"]:
        with open(o["json"], "w", encoding="utf-8") as f:
            json.dump(doc, f)


if __name__ == "__main__":
    main()
