#!/usr/bin/env python3
"""PyTorch's side of `tessel bench step` (tools/bench/step_bench.h).

    python step_bench.py DIR --threads N --warmup W --steps S

DIR holds what tessel wrote (weights.safetensors, batch.safetensors,
meta.json: tools/bench/torch_reference.h). Builds the model with the plain
PyTorch modules of the conformance suite (test/conformance/reference.py:
F.scaled_dot_product_attention, nn.Linear, nn.LayerNorm, ...), loads the same
weights, and times W untimed then S timed steps of forward + loss, backward,
and torch.optim.AdamW (PyTorch's default implementation) + zero_grad(). Prints
one JSON line with the medians (seconds), the first step's loss, the torch
version and thread count.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "test", "conformance"))
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import reference  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.set_default_dtype(torch.float32)
    with open(os.path.join(args.folder, "meta.json")) as f:
        meta = json.load(f)
    batch = load_file(os.path.join(args.folder, "batch.safetensors"))
    ids, targets = batch["ids"], batch["targets"]
    model = reference.load_model(args.folder, meta)
    opt = reference.adamw(model, meta)

    times = {"forward": [], "backward": [], "optimizer": [], "total": []}
    first_loss = None
    for step in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        loss = reference.model_loss(model, model(ids), targets)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        if first_loss is None:
            first_loss = loss.item()
        if step >= args.warmup:
            times["forward"].append(t1 - t0)
            times["backward"].append(t2 - t1)
            times["optimizer"].append(t3 - t2)
            times["total"].append(t3 - t0)
        print(f"  pytorch step {step + 1}/{args.warmup + args.steps}: {t3 - t0:.3f} s", file=sys.stderr)

    result = {k: statistics.median(v) for k, v in times.items()}
    result.update(first_loss=first_loss, torch=torch.__version__.split("+")[0], threads=torch.get_num_threads())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
