#!/usr/bin/env python3
"""PyTorch eager reference for bench/gpu (issue 6): the same two models (dense ~124M non-embedding,
MoE of about equal N at r_a ~ 0.2), the same shapes, batch and synthetic data as bench_gpu, trained
with bf16 autocast and AdamW; prints median step time and tokens/s (consumed) per model.

Usage: python3 torch_ref.py [--steps N] [--warmup N] [--batch B] [--json FILE]
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

DENSE = dict(name="dense-124M", d_model=768, layers=12, dense_layers=12, heads=12, head_dim=64,
             d_ffn=3456, experts=0, top_k=0, d_expert=0, d_shared=0, seq_len=1024, vocab=50304)
MOE = dict(name="moe-ra0.2", d_model=512, layers=8, dense_layers=0, heads=8, head_dim=64,
           d_ffn=0, experts=66, top_k=5, d_expert=128, d_shared=640, seq_len=1024, vocab=50304)


def alibi_slopes(h):
    def pow2(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]
    closest = 1
    while closest * 2 <= h:
        closest *= 2
    s = pow2(closest)
    if closest < h:
        s += pow2(2 * closest)[0::2][: h - closest]
    return torch.tensor(s[:h])


class RMSNorm(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(d))

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * self.w


class SwiGLU(torch.nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.w13 = torch.nn.Linear(d, 2 * f, bias=False)
        self.w2 = torch.nn.Linear(f, d, bias=False)

    def forward(self, x):
        a, b = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(a) * b)


class MoE(torch.nn.Module):
    """Softmax top-K routing without renormalisation; eager loop over experts (sorted gather)."""

    def __init__(self, c):
        super().__init__()
        d, self.E, self.K = c["d_model"], c["experts"], c["top_k"]
        self.router = torch.nn.Linear(d, self.E, bias=False)
        self.experts = torch.nn.ModuleList(SwiGLU(d, c["d_expert"]) for _ in range(self.E))
        self.shared = SwiGLU(d, c["d_shared"]) if c["d_shared"] else None

    def forward(self, x):
        B, S, D = x.shape
        xf = x.reshape(-1, D)
        p = torch.softmax(self.router(xf).float(), dim=-1)
        gate, idx = torch.topk(p, self.K, dim=-1)
        out = self.shared(xf) if self.shared is not None else torch.zeros_like(xf)
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.E).tolist()
        tok = order // self.K
        g = gate.reshape(-1)[order]
        start = 0
        ys = []
        for e, n in enumerate(counts):
            if n:
                ys.append(self.experts[e](xf[tok[start:start + n]]))
            start += n
        y = torch.cat(ys) * g[:, None].to(ys[0].dtype)
        out = out.index_add(0, tok, y.to(out.dtype))
        # load-balance term, as the C++ model (λ = 0.01), so the work matches
        f = torch.bincount(flat, minlength=self.E).float() / flat.numel()
        self.aux = 0.01 * self.E * (f * p.mean(0)).sum()
        return out.reshape(B, S, D)


class Block(torch.nn.Module):
    def __init__(self, c, dense):
        super().__init__()
        d, self.H, self.Dh = c["d_model"], c["heads"], c["head_dim"]
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * self.H * self.Dh, bias=False)
        self.o = torch.nn.Linear(self.H * self.Dh, d, bias=False)
        self.ffn = SwiGLU(d, c["d_ffn"]) if dense else MoE(c)

    def forward(self, x, bias):
        B, S, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).view(B, S, 3, self.H, self.Dh).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        x = x + self.o(a.transpose(1, 2).reshape(B, S, -1))
        return x + self.ffn(self.n2(x))


class Model(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.emb = torch.nn.Embedding(c["vocab"], c["d_model"])
        self.blocks = torch.nn.ModuleList(Block(c, l < c["dense_layers"]) for l in range(c["layers"]))
        self.nf = RMSNorm(c["d_model"])
        self.head = torch.nn.Linear(c["d_model"], c["vocab"], bias=False)
        for n, p in self.named_parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)
        S, H = c["seq_len"], c["heads"]
        i = torch.arange(S)
        rel = (i[:, None] - i[None, :]).float()
        bias = -alibi_slopes(H)[:, None, None] * rel
        bias = bias.masked_fill(rel < 0, float("-inf"))
        self.register_buffer("bias", bias[None].to(torch.bfloat16), persistent=False)

    def forward(self, x, y):
        h = self.emb(x)
        for b in self.blocks:
            h = b(h, self.bias)
        logits = self.head(self.nf(h))
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
        aux = sum(getattr(b.ffn, "aux", 0.0) for b in self.blocks)
        return loss + aux, loss


def batch(B, S, V, step, dev):
    i = torch.arange(B * S, device=dev, dtype=torch.int64)
    x = ((i * 7919 + step * 104729) % V).view(B, S)
    y = (((i + 1) * 7919 + step * 104729) % V).view(B, S)
    return x, y


def run(c, args, dev):
    torch.manual_seed(0)
    m = Model(c).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    times = []
    for s in range(args.warmup + args.steps):
        x, y = batch(args.batch, c["seq_len"], c["vocab"], s, dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            obj, loss = m(x, y)
        obj.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_v = loss.item()  # synchronises, as the C++ step does
        dt = time.perf_counter() - t0
        if s >= args.warmup:
            times.append(dt)
    times.sort()
    n = len(times)  # the median, as bench_gpu's (bench_util.hpp): the mean of the middle two
    t = times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])
    tokens = args.batch * c["seq_len"]
    return dict(name=c["name"], step_seconds=t, tokens_per_second_consumed=tokens / t,
                final_loss=loss_v)


def main():
    ap = argparse.ArgumentParser()
    # As bench_gpu times its points (20 steps after 5 warm-up): the ratio compares like with like.
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    dev = "cuda"
    # The step counts go into the JSON: a ratio against bench_gpu can say how each was timed.
    out = dict(torch=torch.__version__, device=torch.cuda.get_device_name(0), batch_seqs=args.batch,
               steps=args.steps, warmup=args.warmup, points=[])
    print(f"torch {torch.__version__} on {out['device']}, eager, bf16 autocast, SDPA attention")
    print("| model | median step ms | tokens/s (consumed) |\n|---|---|---|")
    for c in (DENSE, MOE):
        r = run(c, args, dev)
        out["points"].append(r)
        print(f"| {r['name']} | {1e3 * r['step_seconds']:.2f} | {r['tokens_per_second_consumed']:.0f} |",
              flush=True)
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
