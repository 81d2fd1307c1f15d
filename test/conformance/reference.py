#!/usr/bin/env python3
"""PyTorch reference for tessel's conformance suite.

Rebuilds NanoGPT (GPT-2), LLaMA and Mixtral as plain PyTorch modules whose
parameter names are tessel's paths, loads the weights tessel exported
(test/conformance/export.cc), and compares logits, loss, every parameter's
gradient and the losses of 10 AdamW steps with tessel's.

    python reference.py DIR [--tol 1e-5] [-v]

Relative error of a tensor = max|tessel - torch| / max|torch| (the error in
units of the tensor's scale; an elementwise ratio would explode at the zeros
every gradient has). For gradients the denominator is at least 1e-4 times the
largest gradient element of the whole model: some gradients are zero in exact
arithmetic (GPT-2's key bias: softmax ignores a shift shared by all keys) and
both sides return rounding noise there (~1e-11), which is only meaningful
against the size of the terms that cancelled. Exit status 1 when any error
exceeds the tolerance.

The modules follow tessel's definitions (nn/*.h, autograd/ops/*.h):
  - GPT-2: pre-LayerNorm blocks (eps from the config), GELU with the tanh
    approximation, biases everywhere, learned positions, head tied to wte.
  - LLaMA: RMSNorm x / sqrt(mean(x^2) + eps) * w; RoPE with the rotate_half
    pairing (i, i + D/2), tables cos/sin(t / theta^(2i/D)) computed in float64
    and rounded to float32 (autograd/ops/rope.h); grouped-query attention
    (query head h reads kv head h // (H / Hkv)); SwiGLU w2(silu(w1 x) * w3 x);
    untied output head.
  - Mixtral: LLaMA with the feed-forward replaced by nn/moe.h's MoE: softmax
    over all E router logits, top-k, weights renormalised over the k; the
    load-balancing loss E * sum_e f_e * P_e with f_e = slots routed to e /
    (N k) (a constant) and P_e = mean router probability; the model's loss is
    cross-entropy + aux_loss_coef * (sum of the layers' aux losses).
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file


# ---- layers ------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(max_seq_len, head_dim, theta):
    half = head_dim // 2
    inv_freq = torch.tensor([1.0 / math.pow(theta, 2 * i / head_dim) for i in range(half)], dtype=torch.float64)
    angles = torch.arange(max_seq_len, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cos(angles).float(), torch.sin(angles).float()


def apply_rotary(x, cos, sin):
    """x [B, T, H, D]; rotate_half pairs (i, i + D/2)."""
    T, half = x.shape[1], x.shape[-1] // 2
    c, s = cos[:T][None, :, None, :], sin[:T][None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


class Attention(nn.Module):
    def __init__(self, dim, n_head, n_kv_head, bias, rope=False, theta=10000.0, max_seq_len=0):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, dim // n_head
        self.wq = nn.Linear(dim, n_head * self.head_dim, bias=bias)
        self.wk = nn.Linear(dim, n_kv_head * self.head_dim, bias=bias)
        self.wv = nn.Linear(dim, n_kv_head * self.head_dim, bias=bias)
        self.wo = nn.Linear(n_head * self.head_dim, dim, bias=bias)
        self.rope = rope
        if rope:
            cos, sin = rope_tables(max_seq_len, self.head_dim, theta)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x):
        B, T, _ = x.shape
        H, Hkv, D = self.n_head, self.n_kv_head, self.head_dim
        q = self.wq(x).view(B, T, H, D)
        k = self.wk(x).view(B, T, Hkv, D)
        v = self.wv(x).view(B, T, Hkv, D)
        if self.rope:
            q = apply_rotary(q, self.rope_cos, self.rope_sin)
            k = apply_rotary(k, self.rope_cos, self.rope_sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if Hkv != H:
            k = k.repeat_interleave(H // Hkv, dim=1)
            v = v.repeat_interleave(H // Hkv, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, H * D))


class MLP(nn.Module):
    def __init__(self, dim, hidden, bias):
        super().__init__()
        self.fc = nn.Linear(dim, hidden, bias=bias)
        self.proj = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class SwiGLU(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoE(nn.Module):
    def __init__(self, dim, hidden, num_experts, top_k):
        super().__init__()
        self.num_experts, self.top_k = num_experts, top_k
        self.gate = nn.Linear(dim, num_experts, bias=False)
        self.experts = nn.ModuleList([SwiGLU(dim, hidden) for _ in range(num_experts)])
        self.aux_loss = None
        self.min_gap = math.inf  # smallest top-k margin seen: routing near a tie is fragile

    def forward(self, x):
        C, E, K = x.shape[-1], self.num_experts, self.top_k
        xf = x.reshape(-1, C)
        N = xf.shape[0]
        probs = F.softmax(self.gate(xf), dim=-1)
        top_p, top_i = torch.topk(probs, K, dim=-1)
        if K < E:
            srt = probs.detach().sort(dim=-1, descending=True).values
            self.min_gap = min(self.min_gap, (srt[:, K - 1] - srt[:, K]).min().item())
        weights = top_p / top_p.sum(-1, keepdim=True)
        out = torch.zeros_like(xf)
        for e in range(E):
            tok, slot = torch.where(top_i == e)
            if tok.numel() == 0:
                continue  # tessel skips idle experts too: their parameters get no gradient
            y = self.experts[e](xf[tok])
            out = out.index_add(0, tok, y * weights[tok, slot][:, None])
        counts = torch.bincount(top_i.flatten(), minlength=E).to(probs.dtype)
        frac = counts / (N * K)
        self.aux_loss = E * (frac * probs.mean(0)).sum()
        return out.reshape(x.shape)


# ---- models ------------------------------------------------------------------------------

class GPTBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c["dim"], eps=c["norm_eps"])
        self.attn = Attention(c["dim"], c["n_head"], c["n_head"], bias=c["bias"])
        self.ln_2 = nn.LayerNorm(c["dim"], eps=c["norm_eps"])
        self.mlp = MLP(c["dim"], c["hidden"], bias=c["bias"])

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.wte = nn.Embedding(c["vocab_size"], c["dim"])
        self.wpe = nn.Embedding(c["max_seq_len"], c["dim"])
        self.layers = nn.ModuleList([GPTBlock(c) for _ in range(c["n_layer"])])
        self.ln_f = nn.LayerNorm(c["dim"], eps=c["norm_eps"])

    def forward(self, ids):
        pos = torch.arange(ids.shape[1])
        x = self.wte(ids) + self.wpe(pos)
        for b in self.layers:
            x = b(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied head

    def aux_loss(self):
        return None


class LlamaBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attn_norm = RMSNorm(c["dim"], c["norm_eps"])
        self.attn = Attention(c["dim"], c["n_head"], c["n_kv_head"], bias=False, rope=True, theta=c["rope_theta"],
                              max_seq_len=c["max_seq_len"])
        self.ffn_norm = RMSNorm(c["dim"], c["norm_eps"])
        if c["arch"] == "mixtral":
            self.ffn = MoE(c["dim"], c["hidden"], c["num_experts"], c["top_k"])
        else:
            self.ffn = SwiGLU(c["dim"], c["hidden"])

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.ffn(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.tok_embeddings = nn.Embedding(c["vocab_size"], c["dim"])
        self.layers = nn.ModuleList([LlamaBlock(c) for _ in range(c["n_layer"])])
        self.norm = RMSNorm(c["dim"], c["norm_eps"])
        self.output = nn.Linear(c["dim"], c["vocab_size"], bias=False)

    def forward(self, ids):
        x = self.tok_embeddings(ids)
        for b in self.layers:
            x = b(x)
        return self.output(self.norm(x))

    def aux_loss(self):
        if self.c["arch"] != "mixtral":
            return None
        return sum(b.ffn.aux_loss for b in self.layers)


def build_model(c):
    return GPT(c) if c["arch"] == "nanogpt" else Llama(c)


def model_loss(model, logits, targets):
    """tessel's LanguageModel::loss: mean cross-entropy (+ coef * aux for MoE, in training)."""
    V = logits.shape[-1]
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    aux = model.aux_loss()
    if aux is not None:
        loss = loss + aux * model.c["aux_loss_coef"]
    return loss


def load_model(folder, meta, dtype=torch.float32):
    model = build_model(meta["config"]).to(dtype)
    weights = {k: v.to(dtype) for k, v in load_file(os.path.join(folder, "weights.safetensors")).items()}
    model.load_state_dict(weights, strict=True)  # names are tessel's paths: any mismatch fails here
    model.train()
    return model


def adamw_losses(model, opt, ids, targets, steps):
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = model_loss(model, model(ids), targets)
        loss.backward()
        losses.append(loss.item())
        opt.step()
    return losses


def float64_check(folder, meta, ids, targets, ours, theirs):
    """Which side is nearer the exact answer? The same run in float64 (weights
    and RoPE tables are float32 values, so only the arithmetic differs)."""
    model = load_model(folder, meta, torch.float64)
    exact = adamw_losses(model, adamw(model, meta), ids, targets, meta["steps"])
    print("  float64 check: each float32 side's relative distance from the float64 run")
    for i, (e, a, b) in enumerate(zip(exact, ours, theirs)):
        print(f"    step {i + 1:2d}: float64 {e:.8f}   tessel {(a - e) / e:+.1e}   torch {(b - e) / e:+.1e}")


def adamw(model, meta):
    """torch.optim.AdamW over tessel's param groups (nn::default_param_groups)."""
    named = dict(model.named_parameters())
    o = meta["adamw"]
    groups = [{"params": [named[p] for p in g["params"]], "weight_decay": g["weight_decay"]}
              for g in meta["param_groups"] if g["params"]]
    covered = sorted(p for g in meta["param_groups"] for p in g["params"])
    if covered != sorted(named):
        raise SystemExit(f"param groups {covered} do not cover the model's parameters {sorted(named)}")
    return torch.optim.AdamW(groups, lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"], weight_decay=o["weight_decay"])


# ---- comparison --------------------------------------------------------------------------

GRAD_FLOOR = 1e-4  # gradients: denominator >= GRAD_FLOOR * the model's largest gradient element


def rel_err(ours, ref, floor=0.0):
    ours, ref = ours.double(), ref.double()
    if ours.shape != ref.shape:
        return math.inf, math.inf
    diff = (ours - ref).abs().max().item() if ref.numel() else 0.0
    scale = max(ref.abs().max().item() if ref.numel() else 0.0, floor)
    return diff, (diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", help="what test/conformance/export wrote")
    ap.add_argument("--tol", type=float, default=1e-5, help="largest relative error accepted")
    ap.add_argument("-v", "--verbose", action="store_true", help="one row per gradient")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--float64-check", action="store_true",
                    help="also run the reference in float64 and show how far each side's losses are from it")
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.set_default_dtype(torch.float32)
    with open(os.path.join(args.folder, "meta.json")) as f:
        meta = json.load(f)
    batch = load_file(os.path.join(args.folder, "batch.safetensors"))
    tessel = load_file(os.path.join(args.folder, "tessel.safetensors"))
    ids, targets = batch["ids"], batch["targets"]

    model = load_model(args.folder, meta)
    opt = adamw(model, meta)
    rows = []  # (what, max|diff|, rel)

    def check(what, ours, ref, floor=0.0):
        d, r = rel_err(ours, ref, floor)
        rows.append((what, d, r))

    losses = []
    for step in range(meta["steps"]):
        opt.zero_grad(set_to_none=True)
        logits = model(ids)
        loss = model_loss(model, logits, targets)
        loss.backward()
        losses.append(loss.item())
        if step == 0:
            check("logits", tessel["logits"], logits.detach())
            check("loss", tessel["loss"], loss.detach())
            if model.aux_loss() is not None:
                check("aux_loss", tessel["aux_loss"], model.aux_loss().detach())
            grad_scale = max(p.grad.abs().max().item() for p in model.parameters() if p.grad is not None)
            for name, p in model.named_parameters():
                key = "grad." + name
                if p.grad is None or key not in tessel:
                    if (p.grad is None) != (key not in tessel):
                        rows.append((f"grad {name}: gradient on one side only", math.inf, math.inf))
                    continue
                check("grad " + name, tessel[key], p.grad, GRAD_FLOOR * grad_scale)
        opt.step()
    check("adamw losses", tessel["adamw_losses"], torch.tensor(losses))

    grads = [r for r in rows if r[0].startswith("grad ")]
    worst = max(grads, key=lambda r: r[2])
    table = [r for r in rows if not r[0].startswith("grad ")]
    table.insert(len(table) - 1, (f"grads ({len(grads)}), worst: {worst[0][5:]}", worst[1], worst[2]))
    if args.verbose:
        table += grads
    gaps = [b.ffn.min_gap for b in model.layers if isinstance(getattr(b, "ffn", None), MoE)]

    name = f"{meta['model']} {meta['config']['name']}"
    print(f"{name}: {meta['config']['n_layer']} layers, dim {meta['config']['dim']}, batch "
          f"{meta['batch']}x{meta['seq']}, {meta['steps']} AdamW steps, torch {torch.__version__}")
    print(f"  {'what':58s} {'max|diff|':>10s} {'rel err':>10s}")
    failed = False
    for what, d, r in table:
        ok = r <= args.tol
        failed |= not ok
        print(f"  {what:58s} {d:10.3e} {r:10.3e}  {'ok' if ok else 'FAIL'}")
    failed |= any(r[2] > args.tol for r in grads)
    print(f"  largest gradient element {grad_scale:.3e} (gradient denominators >= {GRAD_FLOOR:g} x that)")
    print(f"  losses: tessel {tessel['adamw_losses'][0].item():.6f} -> {tessel['adamw_losses'][-1].item():.6f}, "
          f"torch {losses[0]:.6f} -> {losses[-1]:.6f}")
    if gaps:
        print(f"  smallest top-k routing margin: {min(gaps):.3e}")
    if args.float64_check:
        float64_check(args.folder, meta, ids, targets, tessel["adamw_losses"].double().tolist(), losses)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": meta["model"], "failed": failed,
                       "max_rel": {w: r for w, _, r in rows}}, f, indent=1)
    print(f"  {name}: {'FAIL' if failed else 'PASS'} (tolerance {args.tol:g})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
