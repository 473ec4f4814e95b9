// The depthwise kernel of NCHW convolutions (cpu.conv.algo=depthwise): one output plane per input
// channel, 3x3, 5x5 or 7x7, stride 1 or 2. The plane is first copied into scratch with its
// padding's zeros (bounds-checked border pixels cost as much as the whole interior on the 7x7 and
// 14x14 planes of mobile networks); stride 2 splits it into four phases (even/odd rows and columns)
// so that each tap reads consecutive floats. Then all output rows are one flat loop with the taps
// in registers (a 7x7's in passes of a few kernel rows), vectorised across output pixels (rows of 7
// or 14 would fill no AVX-512 vector).
#include <algorithm>

#include "kiln/backends/cpu/kernels/conv.h"

// RelWithDebInfo builds at -O2, where GCC 12 vectorises only loops whose trip count it knows to
// be a multiple of the vector width; the loops here have runtime extents.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("vect-cost-model=dynamic")
#endif

namespace kiln::cpu {

namespace {

// The input rows and columns the output reads, padding included: (O - 1) * S + K along each axis.
int64_t paddedExtent(int64_t outExtent, int64_t stride, int64_t kernel) {
  return (outExtent - 1) * stride + kernel;
}

// Copies plane x into `padded` ([paddedH, paddedW]), zeros where the output reads padding.
[[gnu::always_inline]] inline void padPlane(const ConvShape& s, const float* x, int64_t paddedH,
                                            int64_t paddedW, float* padded) {
  const int64_t first = std::min(s.padLeft, paddedW);
  const int64_t last = std::clamp(s.padLeft + s.width, first, paddedW);
  for (int64_t py = 0; py < paddedH; ++py) {
    float* row = padded + py * paddedW;
    const int64_t iy = py - s.padTop;
    if (iy < 0 || iy >= s.height) {
      std::fill(row, row + paddedW, 0.0f);
      continue;
    }
    std::fill(row, row + first, 0.0f);
    std::copy(x + iy * s.width + (first - s.padLeft), x + iy * s.width + (last - s.padLeft),
              row + first);
    std::fill(row + last, row + paddedW, 0.0f);
  }
}

// Output pixels q in [0, count) of rows `rowStride` floats apart (those past a row's end are
// computed and dropped by the caller), one flat loop vectorised across pixels, as rows of 7 or 14
// pixels would fill no AVX-512 vector. Pixel q's tap (ky, kx) reads in[q + offset(ky, kx)]: the
// padded plane at stride 1, its phases at stride 2. The kernel rows go in passes of `Rows`, each
// pass's taps held in registers and its sums stored to out (the first pass starts from the bias,
// later ones from out); the sums are the same, in the same order, whatever `Rows` is.
template <int K, int Rows, int First = 0, typename Offset>
[[gnu::always_inline]] inline void tapRows(float* __restrict out, const float* __restrict in,
                                           Offset offset, const float* taps, float bias,
                                           int64_t count) {
  constexpr int kLast = std::min(K, First + Rows);
  float w[(kLast - First) * K];
  for (int t = 0; t < (kLast - First) * K; ++t) w[t] = taps[First * K + t];
  for (int64_t q = 0; q < count; ++q) {
    float sum = First == 0 ? bias : out[q];
    for (int ky = First; ky < kLast; ++ky) {
      for (int kx = 0; kx < K; ++kx) sum += w[(ky - First) * K + kx] * in[q + offset(ky, kx)];
    }
    out[q] = sum;
  }
  if constexpr (kLast < K) tapRows<K, Rows, kLast>(out, in, offset, taps, bias, count);
}

// Kernel rows per pass: a 3x3's or 5x5's taps all stay in registers. A 7x7's 49 would not, and
// GCC leaves a loop of that many taps scalar (10x slower); passes of 1, 2 or 3 rows were measured
// alike, 2 marginally ahead at 56x56.
template <int K>
constexpr int kRowsPerPass = K <= 5 ? K : 2;

// Copies rows `stride` floats apart into the [OH, OW] output.
void copyRows(const ConvShape& s, const float* flat, int64_t stride, float* out) {
  for (int64_t oy = 0; oy < s.outHeight; ++oy) {
    std::copy(flat + oy * stride, flat + oy * stride + s.outWidth, out + oy * s.outWidth);
  }
}

// Stride 2 as four stride-1 problems: phase (a, b) holds the padded plane's pixels (2i + a,
// 2j + b), [OH + K / 2, OW + K / 2] each, zeros in the padding. Tap (ky, kx) of output (oy, ox)
// is phase (ky % 2, kx % 2)'s pixel (oy + ky / 2, ox + kx / 2).
struct Phases {
  int64_t height, width;
  int64_t floats() const { return height * width; }
};

Phases phasesOf(const ConvShape& s) {
  return {s.outHeight + s.kernelH / 2, s.outWidth + s.kernelW / 2};
}

// Each input row goes to one phase row of each column parity: a stride-2 copy, no bounds checks.
[[gnu::always_inline]] inline void splitPhases(const ConvShape& s, const float* x, Phases ph,
                                               float* phases) {
  std::fill(phases, phases + 4 * ph.floats(), 0.0f);
  for (int64_t iy = 0; iy < s.height; ++iy) {
    const int64_t py = iy + s.padTop, i = py / 2;
    if (i >= ph.height) break;
    const float* in = x + iy * s.width;
    // Input column ix lands in column parity (ix + padLeft) % 2, at (ix + padLeft) / 2.
    const int64_t end = std::min(s.width, 2 * ph.width - s.padLeft);
    for (int64_t b = 0; b < 2; ++b) {
      float* row = phases + ((py % 2) * 2 + b) * ph.floats() + i * ph.width;
      const int64_t first = ((b - s.padLeft) % 2 + 2) % 2;
      const int64_t count = first < end ? (end - first + 1) / 2 : 0;
      float* __restrict to = row + (first + s.padLeft) / 2;
      const float* __restrict from = in + first;
      for (int64_t k = 0; k < count; ++k) to[k] = from[2 * k];
    }
  }
}

template <int K>
[[gnu::always_inline]] inline void stride2Plane(const DepthwisePlane& p) {
  const ConvShape& s = *p.shape;
  const Phases ph = phasesOf(s);
  splitPhases(s, p.x, ph, p.scratch);
  // One flat loop over the output rows at the phases' row stride, as stride 1.
  float* flat = p.scratch + 4 * ph.floats();
  const auto offset = [ph](int ky, int kx) {
    return ((ky % 2) * 2 + kx % 2) * ph.floats() + (ky / 2) * ph.width + kx / 2;
  };
  tapRows<K, kRowsPerPass<K>>(flat, p.scratch, offset, p.w, p.bias,
                              (s.outHeight - 1) * ph.width + s.outWidth);
  copyRows(s, flat, ph.width, p.out);
}

template <int K>
[[gnu::always_inline]] inline void stride1Plane(const DepthwisePlane& p) {
  const ConvShape& s = *p.shape;
  const int64_t paddedH = paddedExtent(s.outHeight, 1, K);
  const int64_t paddedW = paddedExtent(s.outWidth, 1, K);
  // Unpadded, the output reads the input in place.
  const bool inPlace = s.padTop == 0 && s.padLeft == 0 && paddedH <= s.height && paddedW <= s.width;
  const float* in = p.x;
  int64_t rowStride = s.width;
  if (!inPlace) {
    padPlane(s, p.x, paddedH, paddedW, p.scratch);
    in = p.scratch;
    rowStride = paddedW;
  }
  float* flat = p.scratch + paddedH * paddedW;
  const auto offset = [rowStride](int ky, int kx) { return ky * rowStride + kx; };
  tapRows<K, kRowsPerPass<K>>(flat, in, offset, p.w, p.bias,
                              (s.outHeight - 1) * rowStride + s.outWidth);
  copyRows(s, flat, rowStride, p.out);
}

// One function per kernel size and stride, each compiled for AVX-512, AVX2 and the baseline.
KILN_VECTOR_CLONES void plane3s1(const DepthwisePlane& p) { stride1Plane<3>(p); }
KILN_VECTOR_CLONES void plane3s2(const DepthwisePlane& p) { stride2Plane<3>(p); }
KILN_VECTOR_CLONES void plane5s1(const DepthwisePlane& p) { stride1Plane<5>(p); }
KILN_VECTOR_CLONES void plane5s2(const DepthwisePlane& p) { stride2Plane<5>(p); }
KILN_VECTOR_CLONES void plane7s1(const DepthwisePlane& p) { stride1Plane<7>(p); }
KILN_VECTOR_CLONES void plane7s2(const DepthwisePlane& p) { stride2Plane<7>(p); }

}  // namespace

bool depthwiseKernelFits(const ConvShape& s) {
  return s.group == s.channels && s.outChannels == s.channels && s.kernelH == s.kernelW &&
         (s.kernelH == 3 || s.kernelH == 5 || s.kernelH == 7) && s.strideH == s.strideW &&
         (s.strideH == 1 || s.strideH == 2) && s.dilationH == 1 && s.dilationW == 1;
}

int64_t depthwiseScratchFloats(const ConvShape& s) {
  if (s.strideH == 2) {
    const Phases ph = phasesOf(s);
    return 4 * ph.floats() + s.outHeight * ph.width;
  }
  // The padded plane, then the output rows at the input's row stride.
  const int64_t paddedW = paddedExtent(s.outWidth, s.strideW, s.kernelW);
  return paddedExtent(s.outHeight, s.strideH, s.kernelH) * paddedW +
         s.outHeight * std::max(paddedW, s.width);
}

void depthwisePlane(const DepthwisePlane& p) {
  const ConvShape& s = *p.shape;
  const bool stride1 = s.strideH == 1;
  if (s.kernelH == 3) {
    stride1 ? plane3s1(p) : plane3s2(p);
  } else if (s.kernelH == 5) {
    stride1 ? plane5s1(p) : plane5s2(p);
  } else {
    stride1 ? plane7s1(p) : plane7s2(p);
  }
}

}  // namespace kiln::cpu
