"""The transformers side of generation and fine-tuning conformance
(test/conformance/generate.sh, ./tessel conformance --generate).

  generate_check.py save --model M --dir D
      a random transformers model of family M (gpt2 | llama | mixtral) saved
      to D/hf (sharded), prompts (D/prompts.txt: one "1,5,9" per line), its
      greedy tokens for each prompt alone (D/expected.json) and a batch of ids
      (D/batch.safetensors) for the round trip.
  generate_check.py tokens --dir D --tessel FILE
      tessel generate --json's lines must hold exactly the expected tokens.
  generate_check.py logits --dir D --tol T
      transformers loads D/ft_hf (tessel's fine-tuned model, exported) and its
      logits for the batch must match tessel's (D/ft_tessel_logits.safetensors)
      within T relative (max |a - b| / max |b|); they must also differ from the
      model before fine-tuning (the steps changed the weights).
"""
import argparse
import json
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, MixtralConfig

NEW_TOKENS = 20


def config(model):
    # Small enough for a few seconds on 2 cores; heads divisible by tp=2;
    # vocabulary 256 so tessel can fine-tune it on bytes. A wider init than
    # the default makes the logits decisive (no near-ties for greedy).
    if model == "gpt2":
        return GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4, bos_token_id=None, eos_token_id=None,
                          initializer_range=0.1, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    common = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  initializer_range=0.1, tie_word_embeddings=False, rms_norm_eps=1e-5)
    if model == "llama":
        return LlamaConfig(**common)
    if model == "mixtral":
        return MixtralConfig(num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02, **common)
    raise SystemExit(f"unknown model {model}")


def load(d):
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    m.eval()
    return m


def rel(a, b):
    return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["save", "tokens", "logits"])
    ap.add_argument("--model")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--tessel")
    ap.add_argument("--tol", type=float, default=1e-5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    d = a.dir
    if a.mode == "save":
        torch.manual_seed(1234)
        model = AutoModelForCausalLM.from_config(config(a.model), dtype=torch.float32, attn_implementation="eager")
        model.eval()
        model.save_pretrained(f"{d}/hf", max_shard_size="100KB")
        g = torch.Generator().manual_seed(5)
        prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (3, 5, 5, 8)]
        expected = []
        with torch.no_grad():
            for p in prompts:
                out = model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                     do_sample=False, eos_token_id=None, pad_token_id=0)
                expected.append(out[0, len(p):].tolist())
        with open(f"{d}/prompts.txt", "w") as f:
            f.write("".join(",".join(map(str, p)) + "\n" for p in prompts))
        json.dump({"prompts": prompts, "tokens": expected, "new_tokens": NEW_TOKENS}, open(f"{d}/expected.json", "w"))
        save_file({"ids": torch.randint(0, 256, (2, 16), generator=g)}, f"{d}/batch.safetensors")
        with torch.no_grad():
            logits = model(input_ids=load_file(f"{d}/batch.safetensors")["ids"]).logits.float().contiguous()
        save_file({"logits": logits}, f"{d}/hf_logits.safetensors")
        print(f"  transformers {model.config.model_type}: saved to {d}/hf, greedy tokens of {len(prompts)} prompts")
        return
    if a.mode == "tokens":
        exp = json.load(open(f"{d}/expected.json"))
        got = [json.loads(line) for line in open(a.tessel) if line.startswith("{")]
        ok = len(got) == len(exp["tokens"])
        same = 0
        for i, (e, line) in enumerate(zip(exp["tokens"], got)):
            if line["prompt_ids"] != exp["prompts"][i] or line["ids"] != e:
                ok = False
                print(f"  prompt {i}: transformers {e}\n            tessel       {line['ids']}")
            else:
                same += 1
        print(f"  {same} of {len(exp['tokens'])} prompts: tessel's greedy tokens == transformers' ({a.tessel})")
        sys.exit(0 if ok else 1)
    # logits
    ids = load_file(f"{d}/batch.safetensors")["ids"]
    with torch.no_grad():
        hf = load(f"{d}/ft_hf")(input_ids=ids).logits.float()
    tessel = load_file(f"{d}/ft_tessel_logits.safetensors")["logits"]
    before = load_file(f"{d}/hf_logits.safetensors")["logits"]
    err, moved = rel(tessel, hf), rel(before, hf)
    print(f"  round trip: transformers on tessel's fine-tuned export vs tessel: max rel err {err:.2e} "
          f"(fine-tuning moved the logits by {moved:.2e})")
    if not err <= a.tol or not moved > 100 * a.tol:
        print(f"  FAILED: err {err:.2e} (tol {a.tol}), moved {moved:.2e}")
        sys.exit(1)


if __name__ == "__main__":
    main()
