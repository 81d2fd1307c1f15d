#!/usr/bin/env python3
"""PyTorch's side of `tessel bench step` (tools/bench/step_bench.h).

    python step_bench.py DIR --threads N

DIR holds what tessel wrote (weights.safetensors, batch.safetensors,
meta.json: tools/bench/torch_reference.h). Builds the model with the plain
PyTorch modules of the conformance suite (test/conformance/reference.py:
F.scaled_dot_product_attention, nn.Linear, nn.LayerNorm, ...), loads the same
weights, then serves tessel's bench over stdin/stdout, one JSON line per
answer: first {"ready", "torch", "threads"}; then for each "step" line one
training step -- forward + loss, backward, torch.optim.AdamW (PyTorch's
default implementation) + zero_grad() -- answered with its times in seconds,
the process CPU time of the step ("cpu") and the loss; "quit" ends. tessel alternates its own steps with these, so
both see the same machine (the machine may be shared and busy).
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "test", "conformance"))
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import reference  # noqa: E402


def step(model, opt, ids, targets):
    c0 = time.process_time()
    t0 = time.perf_counter()
    loss = reference.model_loss(model, model(ids), targets)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    opt.step()
    opt.zero_grad(set_to_none=True)
    t3 = time.perf_counter()
    c3 = time.process_time()
    return {"forward": t1 - t0, "backward": t2 - t1, "optimizer": t3 - t2, "cpu": c3 - c0, "loss": loss.item()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--threads", type=int, required=True)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.set_default_dtype(torch.float32)
    with open(os.path.join(args.folder, "meta.json")) as f:
        meta = json.load(f)
    batch = load_file(os.path.join(args.folder, "batch.safetensors"))
    ids, targets = batch["ids"], batch["targets"]
    model = reference.load_model(args.folder, meta)
    opt = reference.adamw(model, meta)

    def say(obj):
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    # The ISA PyTorch's CPU kernels (and oneDNN/MKL) dispatch to, e.g. "AVX512".
    capability = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "unknown")()
    say({"ready": True, "torch": torch.__version__.split("+")[0], "threads": torch.get_num_threads(),
         "cpu_capability": "torch ISA " + str(capability)})
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "step":
            say(step(model, opt, ids, targets))
        elif cmd == "quit":
            break
        else:
            say({"error": f"unknown command {cmd!r}"})


if __name__ == "__main__":
    main()
