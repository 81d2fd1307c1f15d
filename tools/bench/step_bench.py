#!/usr/bin/env python3
"""PyTorch's side of `tessel bench step` (tools/bench/step_bench.h).

    python step_bench.py DIR --threads N [--compile]

DIR holds what tessel wrote (weights.safetensors, batch.safetensors,
meta.json: tools/bench/torch_reference.h). Builds the model with the plain
PyTorch modules of the conformance suite (test/conformance/reference.py:
F.scaled_dot_product_attention, nn.Linear, nn.LayerNorm, ...), loads the same
weights, then serves tessel's bench over stdin/stdout, one JSON line per
answer: first {"ready", "torch", "threads"}; then for each "step" line one
training step -- forward + loss, backward, torch.optim.AdamW (PyTorch's
default implementation) + zero_grad() -- answered with its times in seconds,
the process CPU time of the step ("cpu") and the loss; "profile" takes one
more step with each part under torch.profiler and answers each op's self
time by part (`bench step --profile`: the op-by-op comparison);
"reset_peak" restarts the process's peak resident memory (VmHWM) and
"memory" answers it; "quit" ends. With --compile the model runs under
torch.compile (inductor, CPU): `bench step --torch-compile` starts a second
such process as a second reference; a step that fails (no compiler, an
inductor error) answers {"error": ...}.
tessel alternates its own steps with these, so both see the same machine (the
machine may be shared and busy).
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


# `bench step --profile` compares the two sides op by op in these categories
# (tools/bench/step_bench.cc classifies tessel's op names into the same set).
# The CPU autograd engine runs backward nodes on the calling thread, and
# intra-op workers record nothing, so self times here are the main thread's
# wall time in each op: the same measure as tessel's profiler.
CATEGORIES = [
    ("linear (GEMM, bias)", ("aten::addmm", "aten::mm", "aten::bmm", "aten::matmul", "aten::linear", "aten::sum",
                             "AddmmBackward0", "MmBackward0", "aten::t", "TBackward0")),
    ("attention", ("aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
                   "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
                   "ScaledDotProductFlashAttentionForCpuBackward0")),
    ("norm", ("aten::layer_norm", "aten::native_layer_norm", "aten::native_layer_norm_backward",
              "NativeLayerNormBackward0", "aten::rms_norm", "aten::_fused_rms_norm", "aten::_fused_rms_norm_backward")),
    ("activation", ("aten::gelu", "aten::gelu_backward", "GeluBackward0", "aten::silu", "aten::silu_backward",
                    "SiluBackward0")),
    ("loss", ("aten::cross_entropy_loss", "aten::log_softmax", "aten::_log_softmax", "aten::nll_loss",
              "aten::nll_loss_nd", "aten::nll_loss_forward", "aten::nll_loss_backward",
              "aten::_log_softmax_backward_data", "NllLossBackward0", "LogSoftmaxBackward0")),
    ("embedding", ("aten::embedding", "aten::index_select", "aten::embedding_backward",
                   "aten::embedding_dense_backward", "aten::index_add_", "aten::index_put_", "EmbeddingBackward0")),
]
CATEGORY_OF = {name: cat for cat, names in CATEGORIES for name in names}


def category(name):
    """The comparison's category of a forward or backward op (every op of the
    optimizer part is "optimizer"); views, copies, elementwise ops and gradient
    accumulation go to "other" (named one by one in the raw table)."""
    return CATEGORY_OF.get(name, "other")


class quiet_native_stderr:
    """torch.profiler's C++ side (Kineto) logs two lines per profile to file
    descriptor 2 ("profiler_start"/"profiler_stop"), whatever its log level:
    point the descriptor at /dev/null meanwhile. Python exceptions still
    reach the terminal: they are printed after the descriptor is restored."""

    def __enter__(self):
        sys.stderr.flush()
        self.saved = os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)

    def __exit__(self, *exc):
        os.dup2(self.saved, 2)
        os.close(self.saved)
        return False


def profiled_step(model, opt, ids, targets):
    """One step with each part under its own torch.profiler:
    {"parts": {part: {op: [calls, self seconds]}}, "wall": {part: seconds}, "categories": {op: category}}."""
    from torch.profiler import ProfilerActivity, profile

    parts, wall = {}, {}

    def collect(part, prof):
        ops = {}
        for e in prof.key_averages():
            if e.self_cpu_time_total > 0:
                ops[e.key] = [e.count, e.self_cpu_time_total * 1e-6]
        parts[part] = ops

    with profile(activities=[ProfilerActivity.CPU]) as p:
        t0 = time.perf_counter()
        loss = reference.model_loss(model, model(ids), targets)
        wall["forward"] = time.perf_counter() - t0
    collect("forward", p)
    with profile(activities=[ProfilerActivity.CPU]) as p:
        t0 = time.perf_counter()
        loss.backward()
        wall["backward"] = time.perf_counter() - t0
    collect("backward", p)
    with profile(activities=[ProfilerActivity.CPU]) as p:
        t0 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        wall["optimizer"] = time.perf_counter() - t0
    collect("optimizer", p)
    return {"parts": parts, "wall": wall, "categories": {k: category(k) for ops in parts.values() for k in ops}}


def rss_peak_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def reset_rss_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--compile", action="store_true", help="run the model under torch.compile (inductor)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.set_default_dtype(torch.float32)
    with open(os.path.join(args.folder, "meta.json")) as f:
        meta = json.load(f)
    batch = load_file(os.path.join(args.folder, "batch.safetensors"))
    ids, targets = batch["ids"], batch["targets"]
    model = reference.load_model(args.folder, meta)
    opt = reference.adamw(model, meta)
    # The optimizer holds the module's parameters; the compiled module
    # (compiled on its first call) shares them.
    run = torch.compile(model) if args.compile else model

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
            try:
                say(step(run, opt, ids, targets))
            except Exception as e:  # torch.compile: no compiler, an inductor error
                if not args.compile:
                    raise
                say({"error": f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"})
        elif cmd == "profile":
            with quiet_native_stderr():
                answer = profiled_step(run, opt, ids, targets)
            say(answer)
        elif cmd == "reset_peak":
            reset_rss_peak()
            say({"ok": True})
        elif cmd == "memory":
            say({"rss_peak_bytes": rss_peak_bytes()})
        elif cmd == "quit":
            break
        else:
            say({"error": f"unknown command {cmd!r}"})


if __name__ == "__main__":
    main()
