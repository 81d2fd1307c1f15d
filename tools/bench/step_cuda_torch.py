#!/usr/bin/env python3
"""PyTorch reference for `bench step_cuda`: the same GPT-2 (nanoGPT) training
step -- forward, cross-entropy, backward, clip_grad_norm_(1.0), fused AdamW --
in eager mode and under torch.compile, bf16 autocast or fp32, on the same GPU.
Prints one JSON line: {"eager": {...}, "compile": {...}} with step_ms and
tokens_per_s (MFU is computed by the caller with its own FLOP count)."""
import argparse, json, math, statistics, sys, time

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {  # name: (n_layer, n_head, n_embd, vocab)
    "gpt2-124m": (12, 12, 768, 50304),
    "gpt2-350m": (24, 16, 1024, 50304),
    "tiny": (2, 4, 64, 256),
}


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.h = h

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, H, d, V, T):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, d), nn.Embedding(T, d)
        self.blocks = nn.ModuleList(Block(d, H) for _ in range(L))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, V, bias=False)
        self.head.weight = self.wte.weight
        # GPT-2's init (as tessel's nanogpt): N(0, 0.02), zero biases, unit
        # norms. PyTorch's defaults (N(0, 1) embeddings, tied to the head)
        # make the loss start near 90 instead of ln(vocab) ~ 10.8.
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def run(model, args, compiled):
    dev = "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    step_model = torch.compile(model) if compiled else model
    ids = torch.randint(0, CONFIGS[args.config][3], (args.batch, args.seq + 1), device=dev)
    x, y = ids[:, :-1], ids[:, 1:]
    times = []
    for s in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
            loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        torch.cuda.synchronize()
        if s >= args.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    ms = statistics.median(times)
    return {"step_ms": ms, "tokens_per_s": args.batch * args.seq / (ms / 1e3), "loss": float(loss)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="gpt2-124m")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--dtype", default="bf16")
    args = p.parse_args()
    if args.config not in CONFIGS:
        print(json.dumps({"error": f"no PyTorch reference for config {args.config}"}))
        return
    L, H, d, V = CONFIGS[args.config]
    torch.manual_seed(0)
    result = {}
    for name, compiled in (("eager", False), ("compile", True)):
        model = GPT(L, H, d, V, args.seq).cuda()
        try:
            result[name] = run(model, args, compiled)
        except Exception as e:  # torch.compile may be unavailable (no triton / compiler)
            result[name] = {"error": str(e)[:200]}
        print(name, result[name], file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
