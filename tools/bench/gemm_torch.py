#!/usr/bin/env python3
"""PyTorch's side of `tessel bench gemm` (tools/bench/gemm_bench.h): torch.mm,
which PyTorch's CPU build sends to its BLAS (MKL in the PyPI wheels), as a
second reference next to OpenBLAS, timed in the same run.

    python gemm_torch.py --threads N

Serves the bench over stdin/stdout, one JSON line per answer: first
{"ready", "torch", "threads", "blas", "cpu_capability"}; then
  "shape M N K TT"  float32 operands of that problem (TT: "nn", "nt", "tn" or
                    "tt"; a transposed operand is a transposed view, as the
                    bench's are strided), answered {"ok": true};
  "time P"          one torch.mm into a preallocated output, timed; with P = 1
                    one untimed call first (threads awake, as the other sides
                    do for short problems): {"s": seconds};
  "quit"            ends.
"""
import argparse
import json
import sys
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(42)

    def say(obj):
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    blas = "MKL" if torch.backends.mkl.is_available() else "BLAS (not MKL)"
    capability = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "unknown")()
    say({"ready": True, "torch": torch.__version__.split("+")[0], "threads": torch.get_num_threads(), "blas": blas,
         "cpu_capability": "torch ISA " + str(capability)})
    a = b = c = None
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "shape":
            m, n, k, tt = int(words[1]), int(words[2]), int(words[3]), words[4]
            a = torch.rand(k, m).t() if tt[0] == "t" else torch.rand(m, k)
            b = torch.rand(n, k).t() if tt[1] == "t" else torch.rand(k, n)
            c = torch.empty(m, n)
            say({"ok": True})
        elif words[0] == "time":
            if len(words) > 1 and words[1] == "1":
                torch.mm(a, b, out=c)
            t0 = time.perf_counter()
            torch.mm(a, b, out=c)
            say({"s": time.perf_counter() - t0})
        elif words[0] == "quit":
            break
        else:
            say({"error": f"unknown command {line.strip()!r}"})


if __name__ == "__main__":
    main()
