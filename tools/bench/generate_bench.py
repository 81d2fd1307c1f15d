"""transformers' side of `tessel bench generate` (tools/bench/generate_bench.cc).

  generate_bench.py DIR --threads N --new-tokens K

Loads DIR/hf (written by tessel: the same weights) with transformers in
float32 on the CPU, its default (best) attention implementation, and answers
on stdout one JSON line per stdin command: first {"ready", versions}, then
for each "run" one greedy `generate` of DIR/prompts.safetensors ids [B, P]
with K new tokens (KV cache, no early stop) timed: {"s", "tokens"}.
"""
import argparse
import json
import sys
import time

import torch
import transformers
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--new-tokens", type=int, required=True)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = AutoModelForCausalLM.from_pretrained(f"{a.dir}/hf", dtype=torch.float32)
    model.eval()
    ids = load_file(f"{a.dir}/prompts.safetensors")["ids"]
    print(json.dumps({"ready": True, "torch": torch.__version__, "transformers": transformers.__version__,
                      "threads": torch.get_num_threads(), "attn": model.config._attn_implementation,
                      "cpu_capability": torch.backends.cpu.get_cpu_capability()}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        with torch.no_grad():
            t0 = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=a.new_tokens,
                                 min_new_tokens=a.new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
            s = time.perf_counter() - t0
        print(json.dumps({"s": s, "tokens": out[:, ids.shape[1]:].tolist()}), flush=True)


if __name__ == "__main__":
    main()
