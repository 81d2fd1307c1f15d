#include "kernels/cuda/geometry_build.h"

namespace tessel::kernels::cuda {

ReduceGeometry make_reduce_geometry(const Dims& xshape, const Dims& xstrides, const Dims& oshape,
                                    const Dims& ostrides) {
  TESSEL_CHECK(xshape.size() == oshape.size(), "reduce", "input shape {} and output shape {} differ in rank",
               xshape, oshape);
  ReduceGeometry g;
  g.outputs = 1;
  g.n = 1;
  for (int d = 0; d < xshape.size(); ++d) {
    if (xshape[d] == 1) continue;
    const bool reduced = oshape[d] == 1;
    if (reduced) {
      g.n *= xshape[d];
      // Merge with the previous reduced dim when they are walked with one stride.
      if (g.red_ndim > 0 && g.red_stride[g.red_ndim - 1] == xstrides[d] * xshape[d]) {
        g.red_size[g.red_ndim - 1] *= xshape[d];
        g.red_stride[g.red_ndim - 1] = xstrides[d];
      } else {
        g.red_size[g.red_ndim] = xshape[d];
        g.red_stride[g.red_ndim] = xstrides[d];
        ++g.red_ndim;
      }
    } else {
      TESSEL_CHECK(oshape[d] == xshape[d], "reduce", "output shape {} is not a keepdim reduction of {}", oshape,
                   xshape);
      g.outputs *= xshape[d];
      const int k = g.kept_ndim;
      if (k > 0 && g.kept_xstride[k - 1] == xstrides[d] * xshape[d] &&
          g.kept_ostride[k - 1] == ostrides[d] * xshape[d]) {
        g.kept_size[k - 1] *= xshape[d];
        g.kept_xstride[k - 1] = xstrides[d];
        g.kept_ostride[k - 1] = ostrides[d];
      } else {
        g.kept_size[k] = xshape[d];
        g.kept_xstride[k] = xstrides[d];
        g.kept_ostride[k] = ostrides[d];
        ++g.kept_ndim;
      }
    }
  }
  // A zero-size dim anywhere: no elements (outputs or n is 0 through it).
  for (int d = 0; d < xshape.size(); ++d) {
    if (xshape[d] == 0) {
      if (oshape[d] == 0) g.outputs = 0;
      else g.n = 0;
    }
  }
  return g;
}

}  // namespace tessel::kernels::cuda
