// The float32 arithmetic of kiln.FusedElementwise's opcodes (ir::EltwiseOpcode), one device
// function each, and the half types' loads and stores by bits. Two compilers read this file: nvcc,
// through eltwise.cu's program interpreter, and NVRTC, which gets it as the preamble of every
// kernel fused_codegen.cc generates (embedded as text at build time). So it includes nothing and
// uses only what both give a device function without headers (the CUDA math functions, inline
// PTX), and the interpreter and the generated kernels compute every opcode alike.
#pragma once

// NaN tests as x != x: NVRTC compiles without fast-math, as nvcc does, so they hold.
__device__ __forceinline__ float kiln_relu(float x) { return x < 0.0f ? 0.0f : x; }
__device__ __forceinline__ float kiln_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float kiln_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ float kiln_exp(float x) { return expf(x); }
__device__ __forceinline__ float kiln_log(float x) { return logf(x); }
__device__ __forceinline__ float kiln_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ float kiln_neg(float x) { return -x; }
__device__ __forceinline__ float kiln_abs(float x) { return fabsf(x); }
__device__ __forceinline__ float kiln_erf(float x) { return erff(x); }
__device__ __forceinline__ float kiln_reciprocal(float x) { return 1.0f / x; }
// std::max(0, std::min(1, v)) as the reference writes it: a NaN v gives 1 (std::min(1, NaN) is
// its first operand). Tested explicitly, as ptxas may turn the pair into a clamp that gives 0.
__device__ __forceinline__ float kiln_hard_sigmoid(float x, float alpha, float beta) {
  const float v = alpha * x + beta;
  if (v != v) return 1.0f;
  const float low = v < 1.0f ? v : 1.0f;
  return 0.0f < low ? low : 0.0f;
}
__device__ __forceinline__ float kiln_hard_swish(float x) {
  const float v = x / 6.0f + 0.5f;
  const float low = v < 1.0f ? v : 1.0f;  // std::min(1, v): NaN gives 1
  return x * (0.0f < low ? low : 0.0f);
}
__device__ __forceinline__ float kiln_leaky_relu(float x, float alpha) {
  return x < 0.0f ? alpha * x : x;
}
// min first, then max, as Clip: with min > max every value becomes max; NaN stays NaN.
__device__ __forceinline__ float kiln_clip(float x, float lo, float hi) {
  if (x < lo) x = lo;
  if (x > hi) x = hi;
  return x;
}
// 0.5 x (1 + erf(x / sqrt 2)) written with erfc, which keeps its precision for negative x.
__device__ __forceinline__ float kiln_gelu(float x) {
  return 0.5f * x * erfcf(-x * 0.70710678118654752440f);
}
// 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), which keeps its precision for negative x.
__device__ __forceinline__ float kiln_gelu_tanh(float x) {
  return x / (1.0f + expf(-2.0f * 0.79788456080286535588f * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float kiln_add(float x, float y) { return x + y; }
__device__ __forceinline__ float kiln_sub(float x, float y) { return x - y; }
__device__ __forceinline__ float kiln_mul(float x, float y) { return x * y; }
__device__ __forceinline__ float kiln_div(float x, float y) { return x / y; }
__device__ __forceinline__ float kiln_pow(float x, float y) { return powf(x, y); }
// NaN-propagating, as numpy's maximum and minimum.
__device__ __forceinline__ float kiln_max(float x, float y) {
  if (x != x || y != y) return x + y;
  return x < y ? y : x;
}
__device__ __forceinline__ float kiln_min(float x, float y) {
  if (x != x || y != y) return x + y;
  return y < x ? y : x;
}

// cuda.eltwise.codegen.fast_math (generated kernels only): the hardware's approximations, a few
// ulps off and with narrower special cases (__fdividef gives 0 for divisors past 2^126; __expf
// and __logf go through ex2.approx and lg2.approx; tanh.approx has about 11 good bits).
__device__ __forceinline__ float kiln_fast_exp(float x) { return __expf(x); }
__device__ __forceinline__ float kiln_fast_log(float x) { return __logf(x); }
__device__ __forceinline__ float kiln_fast_div(float x, float y) { return __fdividef(x, y); }
__device__ __forceinline__ float kiln_fast_reciprocal(float x) { return __fdividef(1.0f, x); }
__device__ __forceinline__ float kiln_fast_sigmoid(float x) {
  return __fdividef(1.0f, 1.0f + __expf(-x));
}
__device__ __forceinline__ float kiln_fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float kiln_fast_gelu_tanh(float x) {
  return __fdividef(x,
                    1.0f + __expf(-2.0f * 0.79788456080286535588f * (x + 0.044715f * x * x * x)));
}

// float16 and bfloat16 by their bits (unsigned short), rounding to nearest even on the way out.
__device__ __forceinline__ float kiln_half_to_float(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ unsigned short kiln_float_to_half(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ float kiln_bfloat16_to_float(unsigned short b) {
  return __uint_as_float(static_cast<unsigned int>(b) << 16);
}
__device__ __forceinline__ unsigned short kiln_float_to_bfloat16(float f) {
  unsigned short b;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
  return b;
}
