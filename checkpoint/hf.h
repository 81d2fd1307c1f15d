#pragma once
// Hugging Face interop: tessel's parameter paths and layouts <-> the names
// and layouts of transformers' GPT2LMHeadModel, LlamaForCausalLM and
// MixtralForCausalLM checkpoints (safetensors, sharded with an index).
//
// GPT-2 (names under "transformer."; the hub's original files have no prefix,
// both are read):
//   wte, wpe, ln_f                   -> transformer.wte / wpe / ln_f
//   layers.i.ln_1 / ln_2             -> transformer.h.i.ln_1 / ln_2
//   layers.i.attn.w{q,k,v}.{weight,bias}
//                                    -> transformer.h.i.attn.c_attn: fused q|k|v, and
//                                       Conv1D weights are [in, out]: c_attn.weight =
//                                       cat(wq, wk, wv).T, bias = cat(bq, bk, bv)
//   layers.i.attn.wo                 -> transformer.h.i.attn.c_proj (weight transposed)
//   layers.i.mlp.fc / proj           -> transformer.h.i.mlp.c_fc / c_proj (weights transposed)
//   the LM head is tied to wte: lm_head.weight is not written (and ignored when read)
// LLaMA:
//   tok_embeddings -> model.embed_tokens; norm -> model.norm; output -> lm_head
//   layers.i.attn_norm / ffn_norm    -> model.layers.i.input_layernorm / post_attention_layernorm
//   layers.i.attn.w{q,k,v,o}         -> model.layers.i.self_attn.{q,k,v,o}_proj
//   layers.i.ffn.w1 / w3 / w2        -> model.layers.i.mlp.gate_proj / up_proj / down_proj
//   No q/k permutation: tessel's RoPE pairs (i, i + D/2) ("rotate_half",
//   autograd/ops/rope.h), which is HF's convention already. (The permutation
//   in HF's convert_llama_weights_to_hf.py maps Meta's interleaved pairs.)
// Mixtral: LLaMA's names, and
//   layers.i.ffn.gate                -> model.layers.i.block_sparse_moe.gate
//   layers.i.ffn.experts.e.w1/w2/w3  -> model.layers.i.block_sparse_moe.experts.e.w1/w2/w3
//   (reading also accepts transformers 5's fused layout: mlp.gate, and
//   mlp.experts.gate_up_proj [E, 2H, D] = w1|w3, mlp.experts.down_proj [E, D, H] = w2).
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "models/config.h"

namespace tessel::checkpoint {

// tessel parameters (plain CPU tensors by path, as Module::named_parameters
// names them) -> HF tensors. Every expected parameter must be present.
NamedTensors to_hf(const models::ModelConfig& config, const NamedTensors& tessel);
// HF tensors -> tessel parameters. Every parameter must be found; names that
// map to nothing are errors (buffers HF may store, like GPT-2's attn.bias
// mask or rotary inv_freq, are skipped).
NamedTensors from_hf(const models::ModelConfig& config, const NamedTensors& hf);

// Where from_hf takes a tessel parameter from: a strided view of one Hugging
// Face tensor (its transpose, a slice of GPT-2's fused q|k|v, one expert of
// transformers 5's fused experts, or the whole tensor; the tied LM head is a
// view of the embedding). Strides and offset count elements of the HF
// tensor's row-major layout. Readers of pieces (checkpoint/hf_reader.h) use
// it to read a rank's part of each parameter and nothing else.
struct HfView {
  std::string name;     // tessel's parameter path
  std::string hf_name;  // the tensor in the files
  Dims shape, strides;
  int64_t offset = 0;
};
// The views of every parameter, from the names, dtypes and shapes of a
// folder's tensors (its headers): the same map, checks and errors as from_hf.
std::vector<HfView> hf_views(const models::ModelConfig& config, const std::vector<TensorSpec>& hf);

// config.json for transformers (model_type, architectures, sizes), and back.
nlohmann::json hf_config_json(const models::ModelConfig& config);
models::ModelConfig model_config_from_hf(const nlohmann::json& config);

// Writes config.json and the tensors: one model.safetensors when they fit in
// max_shard_bytes, else model-00001-of-0000N.safetensors ... and
// model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map"}).
// Each file is written atomically.
void save_hf(const std::string& dir, const models::ModelConfig& config, const NamedTensors& hf,
             uint64_t max_shard_bytes = uint64_t(5) << 30);
// The tensors of an HF model folder (index + shards, or model.safetensors).
NamedTensors load_hf_tensors(const std::string& dir);
nlohmann::json load_hf_config(const std::string& dir);

}  // namespace tessel::checkpoint
