"""The Hugging Face side of the interop check (test/conformance/hf.sh).

  hf_check.py export DIR   transformers loads DIR/hf (written by tessel),
                           computes logits for DIR/batch.safetensors and compares
                           them with DIR/tessel_logits.safetensors; then saves a
                           fresh randomly initialised model of the same config
                           to DIR/hf_back (sharded) with its logits.
  hf_check.py import DIR   compares DIR/tessel_back_logits.safetensors (tessel
                           after loading DIR/hf_back) with transformers' logits.
Relative error = max|a - b| / max|b|; exit status 1 above --tol.
"""
import argparse
import json
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM


def rel(a, b):
    return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)


def hf_logits(model, ids):
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["export", "import"])
    ap.add_argument("dir")
    ap.add_argument("--tol", type=float, default=1e-5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    ids = load_file(f"{a.dir}/batch.safetensors")["ids"]
    if a.mode == "export":
        model = AutoModelForCausalLM.from_pretrained(f"{a.dir}/hf", dtype=torch.float32,
                                                     attn_implementation="eager")
        err = rel(load_file(f"{a.dir}/tessel_logits.safetensors")["logits"], hf_logits(model, ids))
        kind = model.config.model_type
        print(f"  tessel -> HF ({kind}): transformers' logits vs tessel's: max rel err {err:.2e}")
        # The other direction starts from transformers' own random weights.
        torch.manual_seed(11)
        cfg = AutoConfig.from_pretrained(f"{a.dir}/hf")
        fresh = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager")
        fresh.save_pretrained(f"{a.dir}/hf_back", max_shard_size="100KB")
        save_file({"logits": hf_logits(fresh, ids).contiguous()}, f"{a.dir}/hf_back_logits.safetensors")
        names = sorted(load_names(f"{a.dir}/hf_back"))
        print(f"  saved transformers' own weights to hf_back ({len(names)} tensors, e.g. {names[len(names)//2]})")
    else:
        err = rel(load_file(f"{a.dir}/tessel_back_logits.safetensors")["logits"],
                  load_file(f"{a.dir}/hf_back_logits.safetensors")["logits"])
        print(f"  HF -> tessel: tessel's logits vs transformers': max rel err {err:.2e}")
    with open(f"{a.dir}/{a.mode}.json", "w") as f:
        json.dump({"rel_err": err}, f)
    if not err <= a.tol:
        print(f"  FAILED: {err:.2e} > {a.tol}")
        sys.exit(1)


def load_names(d):
    import os
    idx = f"{d}/model.safetensors.index.json"
    if os.path.exists(idx):
        return json.load(open(idx))["weight_map"].keys()
    return load_file(f"{d}/model.safetensors").keys()


if __name__ == "__main__":
    main()
