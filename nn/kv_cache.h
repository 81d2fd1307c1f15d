#pragma once
// The key/value cache of incremental decoding: each nn::Attention keeps the
// keys and values of the tokens it has seen, so generating token n runs the
// model on that one token instead of on all n before it.
//
//   nn::KVCache cache(/*capacity=*/prompt_len + max_new_tokens);
//   {
//     nn::KVCacheScope scope(cache);
//     logits = model->forward(prompt_ids);      // [B, P] at positions 0 .. P-1
//     cache.advance(P);
//     logits = model->forward(next_ids);        // [B, 1] at position P
//     cache.advance(1);
//   }
//
// While a scope is active on the thread, an Attention in eval mode (never in
// training) takes its rotary positions from cache.position(), appends its new
// keys and values to its entry, and attends over every cached position, the
// new tokens causally (query i sees keys 0 .. position + i). GPT's learned
// position embedding reads cache.position() too (models/gpt.cc). Nothing
// else changes: the model is the same object, with the same parameters and
// plans; the cache is the caller's, one per sequence batch.
//
// The caller advances the position after each forward (a forward may be
// split into stages or pipelined, so no single layer knows when it ends).
// The batch size is fixed by the first forward; another one is an error.
//
// Storage: for plain tensors each entry is preallocated to `capacity`
// positions ([B, n_kv_head, capacity, head_dim], the dtype of the keys) and
// written in place; distributed tensors (tensor parallel) are concatenated
// instead, as their shards grow along T with the same placements.
#include <cstdint>
#include <string>
#include <unordered_map>

#include "runtime/tensor.h"

namespace tessel::nn {

class KVCache {
 public:
  // capacity: the most positions the cache will hold (prompt + new tokens);
  // it must fit the model's context (its RoPE tables and position embedding
  // check that themselves).
  explicit KVCache(int64_t capacity);

  // Generation needs only the last position's logits: a model's head may
  // then compute just those ([B, 1, V]; the shipped models do, which spares
  // the prompt's [B, T, V] LM-head GEMM). Each row is the same as in the full
  // output. false: every position's logits.
  bool head_last_position = true;

  int64_t capacity() const { return capacity_; }
  // Tokens cached so far: the position of the next token.
  int64_t position() const { return position_; }
  // Marks n more tokens cached. Every entry written since the last advance
  // must hold exactly position() + n positions (error otherwise, naming the
  // layer): a forward that skipped a layer or ran twice cannot go unnoticed.
  void advance(int64_t n);
  // Forgets every token (a new prompt batch may then have another size).
  void reset();

  struct Entry {
    Tensor k, v;         // [B, Hkv, capacity or length, D]; undefined before the first write
    int64_t length = 0;  // positions written
  };
  // The entry of one attention layer, by its path ("layers.3.attn"); created empty.
  Entry& entry(const std::string& layer);
  size_t num_entries() const { return entries_.size(); }

  // Appends k and v ([B, Hkv, T, D], position() == entry.length on entry) to
  // the layer's entry and returns every cached key and value, [B, Hkv,
  // position() + T, D]. Errors: a layer appended twice before advance(),
  // more than capacity() positions, another batch or head shape.
  std::pair<Tensor, Tensor> append(const std::string& layer, const Tensor& k, const Tensor& v);

 private:
  int64_t capacity_;
  int64_t position_ = 0;
  std::unordered_map<std::string, Entry> entries_;
};

// Makes `cache` the one Attention layers use on this thread for its
// lifetime (restores the previous one after).
class KVCacheScope {
 public:
  explicit KVCacheScope(KVCache& cache);
  ~KVCacheScope();
  KVCacheScope(const KVCacheScope&) = delete;
  KVCacheScope& operator=(const KVCacheScope&) = delete;

 private:
  KVCache* prev_;
};

// The cache in effect on this thread, or nullptr.
KVCache* current_kv_cache();

// What a language model's head should compute on, given its hidden states
// [B, T, C] in `module`'s mode: the last position only ([B, 1, C]) under a
// cache that asks for it in eval mode, else `h` itself.
class Module;
Tensor head_positions(const Module& module, const Tensor& h);

}  // namespace tessel::nn
