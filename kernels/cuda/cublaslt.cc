// cuBLASLt matmuls (fast mode). Determinism (docs/design.md §4 levels 1-2):
// float32 compute without TF32, a fixed 32 MiB workspace per (device, stream),
// the in-place split-K reduction (counter-ordered) excluded, and the
// heuristic's first algorithm cached per problem for the life of the process,
// so a shape always runs the same kernel with the same reduction order.
#include "kernels/cuda/cublaslt.h"

#include <cublasLt.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "kernels/cuda/check.h"
#include "runtime/error.h"

namespace tessel::kernels::cuda {

static_assert(lt_const::kR32F == CUDA_R_32F && lt_const::kR64F == CUDA_R_64F && lt_const::kR16F == CUDA_R_16F &&
                  lt_const::kR16BF == CUDA_R_16BF,
              "cudaDataType mirrors");
static_assert(lt_const::kCompute32F == CUBLAS_COMPUTE_32F, "cublasComputeType_t mirror");
static_assert(lt_const::kEpDefault == CUBLASLT_EPILOGUE_DEFAULT && lt_const::kEpBias == CUBLASLT_EPILOGUE_BIAS &&
                  lt_const::kEpGelu == CUBLASLT_EPILOGUE_GELU && lt_const::kEpGeluBias == CUBLASLT_EPILOGUE_GELU_BIAS &&
                  lt_const::kEpGeluAuxBias == CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
              "cublasLtEpilogue_t mirrors");

namespace {

void check_lt(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    TESSEL_FAIL("matmul", "cuBLASLt {} failed: {} (status {})", what, cublasGetStatusString(st), int(st));
}

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

struct DeviceState {
  cublasLtHandle_t handle = nullptr;
  std::map<cudaStream_t, Tensor> workspace;  // per stream: concurrent streams never share one
};

std::mutex g_mu;
std::map<int, DeviceState>* g_devices = new std::map<int, DeviceState>();  // never freed (used until exit)

struct AlgoEntry {
  bool found = false;
  cublasLtMatmulAlgo_t algo{};
};
std::map<std::string, AlgoEntry>* g_algos = new std::map<std::string, AlgoEntry>();

int alignment_of(const void* p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && (v % uintptr_t(a)) != 0) a /= 2;
  return a;
}

// RAII for the per-call descriptors.
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

void make_layout(cublasLtMatrixLayout_t* l, int dtype, const LtOperand& o, int64_t batch) {
  check_lt(cublasLtMatrixLayoutCreate(l, cudaDataType(dtype), uint64_t(o.rows), uint64_t(o.cols), o.ld),
           "layout");
  if (batch > 1) {
    const int32_t count = int32_t(batch);
    const int64_t stride = o.batch_stride;
    check_lt(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
             "layout batch");
    check_lt(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                              sizeof(stride)),
             "layout batch stride");
  }
}

}  // namespace

bool lt_matmul(const CudaCall& call, const LtPlan& plan, const void* a, const void* b, void* out, bool accumulate,
               const void* bias, void* aux, int64_t aux_ld) {
  TESSEL_CHECK(plan.ok, "matmul", "cuBLASLt plan is not usable: {}", plan.why);
  cublasLtHandle_t handle;
  void* ws;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    DeviceState& st = (*g_devices)[call.device()];
    if (!st.handle) check_lt(cublasLtCreate(&st.handle), "create");
    Tensor& w = st.workspace[call.stream()];
    if (!w.defined()) w = raw::empty(Dims{int64_t(kWorkspaceBytes)}, DType::Bool, call.dev());
    handle = st.handle;
    ws = w.raw_data();
  }
  // cuBLASLt's A is tessel's b, its B is tessel's a (lt_plan.h).
  const void* lt_a = b;
  const void* lt_b = a;
  Descs dsc;
  check_lt(cublasLtMatmulDescCreate(&dsc.op, cublasComputeType_t(plan.compute_type), cudaDataType(plan.scale_type)),
           "matmul descriptor");
  const cublasOperation_t ta = plan.a.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = plan.b.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(dsc.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "transa");
  check_lt(cublasLtMatmulDescSetAttribute(dsc.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "transb");
  const cublasLtEpilogue_t ep = cublasLtEpilogue_t(plan.epilogue);
  check_lt(cublasLtMatmulDescSetAttribute(dsc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)), "epilogue");
  if (bias)
    check_lt(cublasLtMatmulDescSetAttribute(dsc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)), "bias");
  if (aux) {
    check_lt(cublasLtMatmulDescSetAttribute(dsc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)),
             "aux");
    check_lt(cublasLtMatmulDescSetAttribute(dsc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)),
             "aux ld");
  }
  make_layout(&dsc.a, plan.data_type, plan.a, plan.batch);
  make_layout(&dsc.b, plan.data_type, plan.b, plan.batch);
  make_layout(&dsc.d, plan.data_type, plan.d, plan.batch);

  const int al_a = alignment_of(lt_a), al_b = alignment_of(lt_b), al_d = alignment_of(out);
  // device | m,n,k,batch | a | b | d | types | alignments | bias, aux (26 fields; a
  // mismatch is a runtime fmt error, not a compile error, under C++17).
  std::string key = fmt::format(FMT_STRING("{}|{},{},{},{}|{}:{},{},{},{}|{}:{},{},{},{}|{},{}|{},{},{}|{},{},{}|{},{}"), call.device(),
                                plan.m, plan.n, plan.k, plan.batch, plan.a.trans, plan.a.rows, plan.a.cols,
                                plan.a.ld, plan.a.batch_stride, plan.b.trans, plan.b.rows, plan.b.cols, plan.b.ld,
                                plan.b.batch_stride, plan.d.ld, plan.d.batch_stride, plan.data_type, plan.epilogue,
                                plan.compute_type, al_a, al_b, al_d, bias != nullptr, aux_ld);
  cublasLtMatmulAlgo_t algo;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_algos->find(key);
    if (it == g_algos->end()) {
      check_lt(cublasLtMatmulPreferenceCreate(&dsc.pref), "preference");
      const uint64_t wsb = kWorkspaceBytes;
      check_lt(cublasLtMatmulPreferenceSetAttribute(dsc.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                                    sizeof(wsb)),
               "workspace preference");
      // No in-place split-K reduction: its partial sums are ordered by counters at run time.
      const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
      check_lt(cublasLtMatmulPreferenceSetAttribute(dsc.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                    sizeof(schemes)),
               "reduction preference");
      const uint32_t aa = uint32_t(al_a), ab = uint32_t(al_b), ad = uint32_t(al_d);
      check_lt(cublasLtMatmulPreferenceSetAttribute(dsc.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa,
                                                    sizeof(aa)),
               "alignment");
      check_lt(cublasLtMatmulPreferenceSetAttribute(dsc.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab,
                                                    sizeof(ab)),
               "alignment");
      check_lt(cublasLtMatmulPreferenceSetAttribute(dsc.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad,
                                                    sizeof(ad)),
               "alignment");
      check_lt(cublasLtMatmulPreferenceSetAttribute(dsc.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad,
                                                    sizeof(ad)),
               "alignment");
      cublasLtMatmulHeuristicResult_t result{};
      int returned = 0;
      const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, dsc.op, dsc.a, dsc.b, dsc.d, dsc.d, dsc.pref,
                                                               1, &result, &returned);
      AlgoEntry e;
      if (st == CUBLAS_STATUS_SUCCESS && returned > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
        e.found = true;
        e.algo = result.algo;
      }
      it = g_algos->emplace(key, e).first;
    }
    if (!it->second.found) return false;
    algo = it->second.algo;
  }
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  check_lt(cublasLtMatmul(handle, dsc.op, &alpha, lt_a, dsc.a, lt_b, dsc.b, &beta, out, dsc.d, out, dsc.d, &algo, ws,
                          kWorkspaceBytes, call.stream()),
           "matmul");
  return true;
}

bool lt_linear(const Tensor& x, const Tensor& w, const Tensor& bias, LtEpilogue epilogue, const Tensor& out,
               const Tensor& aux) {
  CudaCall call("linear", {&x, &w, &bias, &out, &aux});
  TESSEL_CHECK(x.dim() == 2 && w.dim() == 2 && x.shape()[1] == w.shape()[1] && out.dim() == 2 &&
                   out.shape()[0] == x.shape()[0] && out.shape()[1] == w.shape()[0] && out.is_contiguous() &&
                   x.dtype() == w.dtype() && out.dtype() == x.dtype(),
               "linear", "expects x [M, K], w [N, K] and a contiguous out [M, N] of one dtype, got {}, {}, {}",
               x.desc(), w.desc(), out.desc());
  const bool wants_bias = epilogue == LtEpilogue::Bias || epilogue == LtEpilogue::GeluBias ||
                          epilogue == LtEpilogue::GeluAuxBias;
  TESSEL_CHECK(!wants_bias || (bias.defined() && bias.numel() == w.shape()[0] && bias.is_contiguous() &&
                               bias.dtype() == out.dtype()),
               "linear", "epilogue needs a contiguous bias [{}] of the output dtype, got {}", w.shape()[0],
               bias.desc());
  TESSEL_CHECK(epilogue != LtEpilogue::GeluAuxBias || (aux.defined() && aux.shape() == out.shape() &&
                                                       aux.is_contiguous() && aux.dtype() == out.dtype()),
               "linear", "GELU aux epilogue needs a contiguous aux like the output, got {}", aux.desc());
  const int64_t M = x.shape()[0], K = x.shape()[1], N = w.shape()[0];
  // b = w^T: element (k, n) at n * w_rs + k * w_cs.
  const LtPlan plan = plan_lt_matmul(M, N, K, 1, x.strides()[0], x.strides()[1], 0, w.strides()[1], w.strides()[0], 0,
                                     out.strides()[0], 0, x.dtype(), epilogue);
  if (!plan.ok) return false;
  return lt_matmul(call, plan, x.raw_data(), w.raw_data(), out.raw_data(), false,
                   wants_bias ? bias.raw_data() : nullptr, aux.defined() ? aux.raw_data() : nullptr,
                   aux.defined() ? aux.strides()[0] : 0);
}

}  // namespace tessel::kernels::cuda
