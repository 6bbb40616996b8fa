/* backends/cudnn/conv_unfold.h: conv2d's unfolded path for inputs with few
 * channels (conv_unfold.cu says why and how; conv_graph.c uses it). */
#ifndef STOKE_CUDNN_CONV_UNFOLD_H
#define STOKE_CUDNN_CONV_UNFOLD_H

#include <cuda_runtime_api.h>

#include "stoke/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One convolution (x NHWC [n, h, w, c], weight OIHW [o, c, r, s], dilation
 * 1, groups 1) and its unfolding: full (1) folds every tap (r, s) into the
 * channels, else only the width taps s. The unfolded input is NHWC
 * [n, hu, wu, cu]: full: (ho, wo, pad(r s c)); width: (h, wo, pad(s c)),
 * the channels padded with zeros to a multiple of 8 or 32 (cu). */
typedef struct cu_unfold_geom {
  int n, h, w, c, o, r, s, sh, sw, ph, pw;
  int full;
  int hu, wu, cu;
  int w_ohwi; /* the node's weight (and its gradient) is [o][r][s][c] in memory, else [o][c][r][s] */
} cu_unfold_geom;

/* Elements of the unfolded input. */
long long stoke_cudnn_unfold_numel(const cu_unfold_geom *g);
/* xu = unfold(x) (16-bit values). Each returns the launch's status. */
cudaError_t stoke_cudnn_unfold(const void *x, void *xu, const cu_unfold_geom *g, cudaStream_t stream);
/* wp [o][r'][1][cu] (OHWI, r' = 1 full or r width) = the weight packed to
 * match, zeros in the padding channels. */
cudaError_t stoke_cudnn_unfold_pack_w(const void *w, void *wp, const cu_unfold_geom *g, cudaStream_t stream);
/* dw (OIHW) = dwp unpacked + beta dw; dt STOKE_BF16 or STOKE_F16. */
cudaError_t stoke_cudnn_unfold_unpack_dw(const void *dwp, void *dw, const cu_unfold_geom *g, stoke_dtype dt,
                                         float beta, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
