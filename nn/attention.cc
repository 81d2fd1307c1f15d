#include "nn/attention.h"

#include "autograd/api.h"
#include "nn/context.h"
#include "nn/kv_cache.h"
#include "nn/recompute.h"

namespace tessel::nn {

namespace {
AttentionConfig resolve(AttentionConfig c) {
  const char* L = "Attention";
  TESSEL_CHECK(c.dim > 0 && c.n_head > 0, L, "dim and n_head must be positive, got dim={}, n_head={}", c.dim,
               c.n_head);
  TESSEL_CHECK(c.n_kv_head >= 0 && c.head_dim >= 0, L,
               "n_kv_head and head_dim must be >= 0 (0: derived), got n_kv_head={}, head_dim={}", c.n_kv_head,
               c.head_dim);
  if (c.n_kv_head == 0) c.n_kv_head = c.n_head;
  TESSEL_CHECK(c.n_head % c.n_kv_head == 0, L,
               "n_head ({}) must be a multiple of n_kv_head ({}): each key/value head serves a whole group of query "
               "heads",
               c.n_head, c.n_kv_head);
  if (c.head_dim == 0) {
    TESSEL_CHECK(c.dim % c.n_head == 0, L,
                 "dim ({}) must be divisible by n_head ({}) when head_dim is not given (head_dim = dim / n_head)",
                 c.dim, c.n_head);
    c.head_dim = c.dim / c.n_head;
  }
  if (c.rope) {
    TESSEL_CHECK(c.head_dim % 2 == 0, L, "rope needs an even head_dim, got head_dim={}", c.head_dim);
    TESSEL_CHECK(c.max_seq_len > 0, L, "rope needs max_seq_len > 0 (the table length), got {}", c.max_seq_len);
    TESSEL_CHECK(c.rope_theta > 0.0, L, "rope_theta must be positive, got {}", c.rope_theta);
  }
  TESSEL_CHECK(c.attn_dropout >= 0.0 && c.attn_dropout <= 1.0 && c.resid_dropout >= 0.0 && c.resid_dropout <= 1.0, L,
               "dropout probabilities must be in [0, 1], got attn_dropout={}, resid_dropout={}", c.attn_dropout,
               c.resid_dropout);
  return c;
}
}  // namespace

Attention::Attention(const AttentionConfig& cfg) : UnaryModule("Attention"), config(resolve(cfg)) {
  const int64_t C = config.dim, q_width = config.n_head * config.head_dim;
  const int64_t kv_width = config.n_kv_head * config.head_dim;
  wq = child("wq", std::make_shared<Linear>(C, q_width, config.bias));
  wk = child("wk", std::make_shared<Linear>(C, kv_width, config.bias));
  wv = child("wv", std::make_shared<Linear>(C, kv_width, config.bias));
  wo = child("wo", std::make_shared<Linear>(q_width, C, config.bias));
  resid_drop = child("resid_drop", std::make_shared<Dropout>(config.resid_dropout));
  if (config.rope) {
    const Device dev = ConstructionScope::device();
    const DType dt = ConstructionScope::dtype();
    Tensor c, s;
    if (dev.is_meta()) {
      c = empty({config.max_seq_len, config.head_dim / 2}, TensorOptions(dt).with_device(kMeta));
      s = empty({config.max_seq_len, config.head_dim / 2}, TensorOptions(dt).with_device(kMeta));
    } else {
      std::tie(c, s) = rope_cache(config.max_seq_len, config.head_dim, config.rope_theta, dt, dev);
    }
    buffer("rope_cos", rope_cos, c, /*persistent=*/false);
    buffer("rope_sin", rope_sin, s, /*persistent=*/false);
  }
}

void Attention::init_buffers() {
  if (!config.rope || rope_cos.device().is_meta()) return;
  std::tie(rope_cos, rope_sin) =
      rope_cache(config.max_seq_len, config.head_dim, config.rope_theta, rope_cos.dtype(), rope_cos.device());
}

Tensor Attention::forward(const Tensor& x, int64_t position_offset) {
  const AttentionConfig& c = config;
  TESSEL_CHECK(x.dim() == 3 && x.size(2) == c.dim, "Attention", "'{}' expects x of shape [B, T, {}], got {}", path(),
               c.dim, x.desc());
  const int64_t B = x.size(0), T = x.size(1), H = c.n_head, Hkv = c.n_kv_head, D = c.head_dim;
  // Incremental decoding (nn/kv_cache.h): the cache says where the tokens are.
  KVCache* cache = is_training() ? nullptr : current_kv_cache();
  if (cache) {
    TESSEL_CHECK(position_offset == 0 || position_offset == cache->position(), "Attention",
                 "'{}': position_offset {} disagrees with the KV cache's position {}", path(), position_offset,
                 cache->position());
    position_offset = cache->position();
  }
  TESSEL_CHECK(position_offset >= 0, "Attention", "'{}': position_offset must be >= 0, got {}", path(),
               position_offset);
  TESSEL_CHECK(!c.rope || position_offset + T <= c.max_seq_len, "Attention",
               "'{}': positions {}..{} exceed the RoPE tables (max_seq_len {})", path(), position_offset,
               position_offset + T - 1, c.max_seq_len);
  const Tensor q = (*wq)(x).reshape({B, T, H, D});
  const Tensor k = (*wk)(x).reshape({B, T, Hkv, D});
  const Tensor v = (*wv)(x).reshape({B, T, Hkv, D});
  // The core: RoPE, the fused attention, the head merge. Captured by value:
  // with selective recomputation (nn/recompute.h) the backward runs it again.
  const bool training = is_training();  // a replay draws the forward's dropout even after eval()
  auto core = [this, B, T, H, D, position_offset, cache, training](const std::vector<Tensor>& qkv) {
    const AttentionConfig& c = config;
    Tensor q = qkv[0], k = qkv[1], v = qkv[2];
    if (c.rope) {
      q = apply_rotary(q, rope_cos, rope_sin, position_offset, c.rope_interleaved);
      k = apply_rotary(k, rope_cos, rope_sin, position_offset, c.rope_interleaved);
    }
    AttentionOptions o;
    o.causal = true;
    if (training && c.attn_dropout > 0.0) {
      const std::string site = path().empty() ? "attn_drop" : path() + ".attn_drop";
      o.dropout_p = c.attn_dropout;
      o.dropout_key = random_key(site);
      o.dropout_block = batch_block({B, H, T, T}, "Attention '" + path() + "'");
    }
    Tensor kt = k.transpose(1, 2), vt = v.transpose(1, 2);
    if (cache) {
      const int64_t past = cache->position();
      std::tie(kt, vt) = cache->append(path(), kt, vt);
      if (past > 0) {
        // Query i sits at position past + i and sees keys 0 .. past + i: with
        // one query that is every key; with more, a [T, past + T] mask.
        o.causal = false;
        if (T > 1) {
          Tensor qpos = arange(past, past + T).reshape({T, 1});
          Tensor kpos = arange(int64_t(0), past + T).reshape({1, past + T});
          o.mask = le(kpos, qpos).to(q.device());
        }
      }
    }
    Tensor y = scaled_dot_product_attention(q.transpose(1, 2), kt, vt, o);
    return y.transpose(1, 2).reshape({B, T, H * D});
  };
  // A KV cache appends: never replayed (decoding runs without grad anyway).
  const Tensor y = recompute_core_ && !cache ? nn::recompute(path() + " (attention core)", core, {q, k, v}, {})
                                             : core({q, k, v});
  return (*resid_drop)((*wo)(y));
}

std::string Attention::extra_repr() const {
  const AttentionConfig& c = config;
  std::string s = fmt::format(FMT_STRING("dim={}, n_head={}, n_kv_head={}, head_dim={}, bias={}"), c.dim, c.n_head, c.n_kv_head,
                              c.head_dim, c.bias);
  if (c.rope)
    s += fmt::format(FMT_STRING(", rope(theta={}, max_seq_len={}, {})"), c.rope_theta, c.max_seq_len,
                     c.rope_interleaved ? "interleaved" : "rotate_half");
  if (c.attn_dropout > 0.0) s += fmt::format(FMT_STRING(", attn_dropout={}"), c.attn_dropout);
  return s;
}

}  // namespace tessel::nn
