// CPU random kernels: random_fill and dropout.
//
// Work is split over runs of the innermost (merged) dimension, in parallel.
// Along a run whose global index is contiguous, one Philox call produces a
// whole block (4 narrow / 2 wide elements) and the run's head and tail use
// partial blocks; any other run computes each element from its own block.
// Either way an element's value depends only on its global index, never on
// where a run or a thread's share starts (kernels/random_math.h).
#include <algorithm>

#include "kernels/cpu/loops.h"
#include "kernels/random.h"
#include "runtime/threadpool.h"

namespace tessel::kernels::cpu {
namespace {

// Random draws cost more than a copy: smaller shares still pay off.
constexpr int64_t kRandomGrain = 8192;

// Calls run(e0, gstride, n, out_off, in_off) on runs of the innermost dim
// covering every element once (offsets in elements), in parallel.
template <class Run>
void for_each_run(const RandomGeometry& g, Run&& run) {
  if (g.numel == 0) return;
  if (g.ndim == 0) {
    run(g.base, int64_t(1), int64_t(1), int64_t(0), int64_t(0));
    return;
  }
  const int last = g.ndim - 1;
  const int64_t inner = g.size[last];
  const int64_t gs = g.gstride[last], os = g.ostride[last], is = g.istride[last];
  const int64_t outer = g.numel / inner;
  if (outer == 1) {
    parallel_for(inner, kRandomGrain, [&](int64_t b, int64_t e) {
      run(g.base + uint64_t(b) * uint64_t(gs), gs, e - b, b * os, b * is);
    });
    return;
  }
  const int64_t outer_grain = inner >= kRandomGrain ? 1 : (kRandomGrain + inner - 1) / inner;
  parallel_for(outer, outer_grain, [&](int64_t ob, int64_t oe) {
    for (int64_t o = ob; o < oe; ++o) {
      uint64_t e0 = g.base;
      int64_t oo = 0, io = 0, rem = o;
      for (int d = last - 1; d >= 0; --d) {
        int64_t i = rem % g.size[d];
        rem /= g.size[d];
        e0 += uint64_t(i) * uint64_t(g.gstride[d]);
        oo += i * g.ostride[d];
        io += i * g.istride[d];
      }
      run(e0, gs, inner, oo, io);
    }
  });
}

// Writes n values starting at global index e0 (global stride gs) to out with
// element stride os. Block(r, vals) computes the kPer values of Philox block r.
template <int kPer, class T, class BlockFn>
inline void generate_run(const PhiloxKey& key, uint64_t e0, int64_t gs, int64_t n, T* out, int64_t os,
                         BlockFn&& block_values) {
  constexpr int kShift = kPer == 4 ? 2 : 1;
  T vals[kPer];
  if (gs == 1) {
    int64_t i = 0;
    if (os == 1) {  // whole blocks straight into the output
      if ((e0 & (kPer - 1)) != 0) {
        int w = int(e0 & (kPer - 1));
        block_values(philox::block(key, e0 >> kShift), vals);
        int take = int(std::min<int64_t>(kPer - w, n));
        for (int j = 0; j < take; ++j) out[j] = vals[w + j];
        i = take;
      }
      for (; n - i >= kPer; i += kPer) block_values(philox::block(key, (e0 + uint64_t(i)) >> kShift), out + i);
    }
    while (i < n) {
      uint64_t e = e0 + uint64_t(i);
      int w = int(e & (kPer - 1));
      block_values(philox::block(key, e >> kShift), vals);
      int take = int(std::min<int64_t>(kPer - w, n - i));
      if (os == 1) {
        for (int j = 0; j < take; ++j) out[i + j] = vals[w + j];
      } else {
        for (int j = 0; j < take; ++j) out[(i + j) * os] = vals[w + j];
      }
      i += take;
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      uint64_t e = e0 + uint64_t(i) * uint64_t(gs);
      block_values(philox::block(key, e >> kShift), vals);
      out[i * os] = vals[e & (kPer - 1)];
    }
  }
}

template <RandomDist D, class T>
void fill_typed(const Tensor& out, const RandomParams& p, const GlobalBlock& block) {
  RandomGeometry g = make_random_geometry(out, block);
  T* base = static_cast<T*>(out.raw_data());
  if constexpr (std::is_same_v<T, double> && D != RandomDist::Bernoulli && D != RandomDist::Randint) {
    const auto k = rng::make_consts<double, double>(p);
    for_each_run(g, [&](uint64_t e0, int64_t gs, int64_t n, int64_t oo, int64_t) {
      generate_run<2>(k.key, e0, gs, n, base + oo, g.ndim ? g.ostride[g.ndim - 1] : 1,
                      [&](const Philox4& r, double* v) { rng::wide_block<D>(k, r, v); });
    });
  } else {
    using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const auto k = rng::make_consts<T, C>(p);
    for_each_run(g, [&](uint64_t e0, int64_t gs, int64_t n, int64_t oo, int64_t) {
      generate_run<4>(k.key, e0, gs, n, base + oo, g.ndim ? g.ostride[g.ndim - 1] : 1,
                      [&](const Philox4& r, T* v) { rng::narrow_block<D, T, C>(k, r, v); });
    });
  }
}

template <RandomDist D>
void fill_dist(const Tensor& out, const RandomParams& p, const GlobalBlock& block) {
  const char* name = random_dist_name(D);
  if constexpr (D == RandomDist::Bernoulli) {
    dispatch_all(out.dtype(), name, [&](auto tag) { fill_typed<D, typename decltype(tag)::type>(out, p, block); });
  } else if constexpr (D == RandomDist::Randint) {
    dispatch_numeric(out.dtype(), name, [&](auto tag) { fill_typed<D, typename decltype(tag)::type>(out, p, block); });
  } else {
    dispatch_floating(out.dtype(), name, [&](auto tag) { fill_typed<D, typename decltype(tag)::type>(out, p, block); });
  }
}

void random_fill_cpu(const Tensor& out, const RandomParams& p, const GlobalBlock& block) {
  switch (p.dist) {
    case RandomDist::Uniform: return fill_dist<RandomDist::Uniform>(out, p, block);
    case RandomDist::Normal: return fill_dist<RandomDist::Normal>(out, p, block);
    case RandomDist::Bernoulli: return fill_dist<RandomDist::Bernoulli>(out, p, block);
    case RandomDist::Randint: return fill_dist<RandomDist::Randint>(out, p, block);
    case RandomDist::TruncNormal: return fill_dist<RandomDist::TruncNormal>(out, p, block);
  }
}

void dropout_cpu(const Tensor& in, const Tensor& out, PhiloxKey key, uint32_t keep_threshold, double scale,
                 const GlobalBlock& block) {
  dispatch_floating(out.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    const C sc = C(scale);
    RandomGeometry g = make_random_geometry(out, block, &in);
    T* obase = static_cast<T*>(out.raw_data());
    const T* ibase = static_cast<const T*>(in.raw_data());
    const int64_t os = g.ndim ? g.ostride[g.ndim - 1] : 1, is = g.ndim ? g.istride[g.ndim - 1] : 1;
    for_each_run(g, [&](uint64_t e0, int64_t gs, int64_t n, int64_t oo, int64_t io) {
      T* o = obase + oo;
      const T* x = ibase + io;
      if (gs == 1) {
        int64_t i = 0;
        while (i < n) {
          uint64_t e = e0 + uint64_t(i);
          int w = int(e & 3);
          Philox4 r = philox::block(key, e >> 2);
          int take = int(std::min<int64_t>(4 - w, n - i));
          for (int j = 0; j < take; ++j)
            o[(i + j) * os] = rng::dropout_value<T, C>(keep_threshold, sc, r.v[w + j], x[(i + j) * is]);
          i += take;
        }
      } else {
        for (int64_t i = 0; i < n; ++i) {
          uint64_t e = e0 + uint64_t(i) * uint64_t(gs);
          o[i * os] = rng::dropout_value<T, C>(keep_threshold, sc, philox::bits_at(key, e), x[i * is]);
        }
      }
    });
  });
}

}  // namespace

TESSEL_REGISTER_KERNEL(random_fill, DeviceType::CPU, random_fill_cpu);
TESSEL_REGISTER_KERNEL(dropout, DeviceType::CPU, dropout_cpu);

}  // namespace tessel::kernels::cpu
