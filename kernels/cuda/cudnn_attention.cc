// Fast-mode fused causal attention on the GPU: cuDNN's flash attention
// (scaled dot product, causal mask, fp32 statistics) through the cuDNN C++
// frontend's graph API, forward and backward (kernels/attention.h,
// attention_fast_*). Built only where the frontend headers were found
// (third_party/cuda, tools/deps.sh). One graph per shape/stride/dtype,
// built on first use and cached per device; one cuDNN handle per device and
// thread, bound to the thread's current stream at each call.
#include <cudnn.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <cudnn_frontend.h>

#include "kernels/attention.h"
#include "kernels/cuda/call.h"

namespace tessel::kernels::cuda {
namespace {

namespace fe = cudnn_frontend;
constexpr const char* kOp = "scaled_dot_product_attention (cuDNN)";

void check(fe::error_t e, const char* step) {
  if (e.is_bad()) TESSEL_FAIL(kOp, "{} failed: {}", step, e.get_message());
}

cudnnHandle_t handle_for(const CudaCall& call) {
  thread_local std::map<int, cudnnHandle_t> handles;  // per device; live as long as the thread
  cudnnHandle_t& h = handles[call.device()];
  if (!h) {
    const cudnnStatus_t s = cudnnCreate(&h);
    TESSEL_CHECK(s == CUDNN_STATUS_SUCCESS, kOp, "cudnnCreate failed: {}", cudnnGetErrorString(s));
  }
  const cudnnStatus_t s = cudnnSetStream(h, call.stream());
  TESSEL_CHECK(s == CUDNN_STATUS_SUCCESS, kOp, "cudnnSetStream failed: {}", cudnnGetErrorString(s));
  return h;
}

fe::DataType_t io_type(DType d) {
  switch (d) {
    case DType::BFloat16: return fe::DataType_t::BFLOAT16;
    case DType::Float16: return fe::DataType_t::HALF;
    default: TESSEL_FAIL(kOp, "cuDNN attention takes bfloat16 or float16, got {}", dtype_name(d));
  }
}

std::vector<int64_t> dims_of(const Tensor& t) { return {t.size(0), t.size(1), t.size(2), t.size(3)}; }
std::vector<int64_t> strides_of(const Tensor& t) {
  return {t.strides()[0], t.strides()[1], t.strides()[2], t.strides()[3]};
}

std::string key_of(const char* what, double scale, std::initializer_list<const Tensor*> ts) {
  std::string k = what;
  uint64_t sb = 0;
  std::memcpy(&sb, &scale, sizeof sb);
  k += fmt::format(FMT_STRING("|{:x}"), sb);
  for (const Tensor* t : ts) k += fmt::format(FMT_STRING("|{}:{}:{}"), int(t->dtype()), t->shape(), t->strides());
  return k;
}

struct Cached {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
};

// Graphs by device and key (building one takes milliseconds to seconds).
Cached* find_or_build(int device, const std::string& key, cudnnHandle_t h,
                      const std::function<std::shared_ptr<fe::graph::Graph>()>& make) {
  static std::mutex mu;
  static std::map<int, std::unordered_map<std::string, std::unique_ptr<Cached>>> cache;
  std::lock_guard<std::mutex> lk(mu);
  auto& slot = cache[device][key];
  if (!slot) {
    auto g = make();
    check(g->validate(), "validate");
    check(g->build_operation_graph(h), "build_operation_graph");
    check(g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
    check(g->check_support(h), "check_support");
    check(g->build_plans(h), "build_plans");
    auto c = std::make_unique<Cached>();
    check(g->get_workspace_size(c->workspace), "get_workspace_size");
    c->graph = std::move(g);
    slot = std::move(c);
  }
  return slot.get();
}

enum Uid : int64_t { kQ = 1, kK, kV, kO, kLse, kDO, kDQ, kDK, kDV };

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name, Uid uid, const Tensor& t) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims_of(t)).set_stride(
      strides_of(t)));
}

void execute(const CudaCall& call, cudnnHandle_t h, Cached& c, std::unordered_map<int64_t, void*>& pack) {
  Tensor ws;
  if (c.workspace > 0) ws = scratch(call, {(c.workspace + 7) / 8}, DType::Int64);
  check(c.graph->execute(h, pack, ws.defined() ? ws.raw_data() : nullptr), "execute");
}

void applies_cudnn(const FastAttentionShape& s, bool* ok) {
  *ok = (s.dtype == DType::BFloat16 || s.dtype == DType::Float16) && s.D % 8 == 0 && s.D <= 128 && s.T > 0 &&
        s.Hkv > 0 && s.Hq % s.Hkv == 0;
}

void forward_cudnn(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const Tensor& out,
                   const Tensor& lse) {
  CudaCall call(kOp, {&q, &k, &v, &out, &lse});
  TESSEL_CHECK(lse.dtype() == DType::Float32 && lse.is_contiguous() &&
                   lse.shape() == Dims({q.size(0), q.size(1), q.size(2), 1}),
               kOp, "lse must be contiguous float32 [B, Hq, T, 1], got {}", lse.desc());
  cudnnHandle_t h = handle_for(call);
  Cached* c = find_or_build(call.device(), key_of("fwd", scale, {&q, &k, &v, &out}), h, [&] {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(io_type(q.dtype()))
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto Q = input(*g, "Q", kQ, q), K = input(*g, "K", kK, k), V = input(*g, "V", kV, v);
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("sdpa")
                    .set_generate_stats(true)
                    .set_attn_scale(float(scale))
                    .set_causal_mask(true);
    auto [O, Stats] = g->sdpa(Q, K, V, opts);
    O->set_output(true).set_uid(kO).set_dim(dims_of(out)).set_stride(strides_of(out));
    Stats->set_output(true).set_uid(kLse).set_data_type(fe::DataType_t::FLOAT);
    return g;
  });
  std::unordered_map<int64_t, void*> pack = {{kQ, q.raw_data()},   {kK, k.raw_data()},  {kV, v.raw_data()},
                                             {kO, out.raw_data()}, {kLse, lse.raw_data()}};
  execute(call, h, *c, pack);
}

void backward_cudnn(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
                    const Tensor& lse, double scale, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  CudaCall call(kOp, {&q, &k, &v, &out, &dout, &lse, &dq, &dk, &dv});
  cudnnHandle_t h = handle_for(call);
  Cached* c = find_or_build(call.device(), key_of("bwd", scale, {&q, &k, &v, &out, &dout, &dq, &dk, &dv}), h, [&] {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(io_type(q.dtype()))
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto Q = input(*g, "Q", kQ, q), K = input(*g, "K", kK, k), V = input(*g, "V", kV, v);
    auto O = input(*g, "O", kO, out), dO = input(*g, "dO", kDO, dout);
    auto Stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("Stats")
                               .set_uid(kLse)
                               .set_dim({q.size(0), q.size(1), q.size(2), 1})
                               .set_stride({q.size(1) * q.size(2), q.size(2), 1, 1})
                               .set_data_type(fe::DataType_t::FLOAT));
    // The deterministic algorithm: by default cuDNN's backward adds dQ's
    // pieces with atomics on Hopper, so two runs of the same step differed
    // (found by the GPU bench's eager / compiled comparison on GPT-2 124M);
    // fast mode promises run-to-run bits (docs/design.md §4 level 2).
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("sdpa_backward")
                    .set_attn_scale(float(scale))
                    .set_causal_mask(true)
                    .set_deterministic_algorithm(true);
    auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, opts);
    dQ->set_output(true).set_uid(kDQ).set_dim(dims_of(dq)).set_stride(strides_of(dq));
    dK->set_output(true).set_uid(kDK).set_dim(dims_of(dk)).set_stride(strides_of(dk));
    dV->set_output(true).set_uid(kDV).set_dim(dims_of(dv)).set_stride(strides_of(dv));
    return g;
  });
  std::unordered_map<int64_t, void*> pack = {
      {kQ, q.raw_data()},     {kK, k.raw_data()},   {kV, v.raw_data()},   {kO, out.raw_data()},
      {kDO, dout.raw_data()}, {kLse, lse.raw_data()}, {kDQ, dq.raw_data()}, {kDK, dk.raw_data()},
      {kDV, dv.raw_data()}};
  execute(call, h, *c, pack);
}

}  // namespace

TESSEL_REGISTER_KERNEL(attention_fast_applies, DeviceType::CUDA, applies_cudnn);
TESSEL_REGISTER_KERNEL(attention_fast_forward, DeviceType::CUDA, forward_cudnn);
TESSEL_REGISTER_KERNEL(attention_fast_backward, DeviceType::CUDA, backward_cudnn);

}  // namespace tessel::kernels::cuda
