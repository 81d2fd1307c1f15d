#pragma once
// Boxes (a global tensor's region: offset + size per dim) and the contiguous
// runs in which a region sits inside two row-major boxes: the whole of what
// resharding needs, since every chunk on disk and every local piece is a box.
#include <cstdint>

#include "runtime/shape.h"

namespace tessel::checkpoint {

struct Box {
  Dims offset, size;
  int64_t numel() const { return numel_of(size); }
};

// The intersection of a and b (same rank); false when it is empty.
inline bool intersect(const Box& a, const Box& b, Box* out) {
  out->offset = a.offset;
  out->size = a.size;
  for (int d = 0; d < a.offset.size(); ++d) {
    const int64_t lo = a.offset[d] > b.offset[d] ? a.offset[d] : b.offset[d];
    const int64_t ea = a.offset[d] + a.size[d], eb = b.offset[d] + b.size[d];
    const int64_t hi = ea < eb ? ea : eb;
    if (hi <= lo) return false;
    out->offset[d] = lo;
    out->size[d] = hi - lo;
  }
  return true;
}

// Row-major element offset of global coordinate `at` inside box `b`.
inline int64_t offset_in(const Box& b, const Dims& at) {
  int64_t off = 0;
  for (int d = 0; d < b.size.size(); ++d) off = off * b.size[d] + (at[d] - b.offset[d]);
  return off;
}

// Calls fn(src_elem, dst_elem, n) for every maximal run of `region` (inside
// both boxes) that is contiguous in the row-major layouts of both `src` and
// `dst`, in increasing src order. Trailing dims that the region, src and dst
// all span fully merge into one run.
template <class Fn>
void for_each_run(const Box& src, const Box& dst, const Box& region, Fn&& fn) {
  const int nd = region.size.size();
  if (nd == 0) {
    fn(int64_t(0), int64_t(0), int64_t(1));
    return;
  }
  // Dims [inner, nd) form one run: all of them but the first are spanned fully.
  int inner = nd - 1;
  int64_t run = region.size[nd - 1];
  while (inner > 0 && region.size[inner] == src.size[inner] && region.size[inner] == dst.size[inner]) {
    --inner;
    run *= region.size[inner];
  }
  Dims at = region.offset;
  for (;;) {
    fn(offset_in(src, at), offset_in(dst, at), run);
    int d = inner - 1;
    for (; d >= 0; --d) {
      if (++at[d] < region.offset[d] + region.size[d]) break;
      at[d] = region.offset[d];
    }
    if (d < 0) return;
  }
}

}  // namespace tessel::checkpoint
