// kiln's elementwise kernels on the GPU (eltwise.cu): unary math and activations, broadcasting
// binary arithmetic, comparisons and logic, Pow, Where, variadic Sum/Mean/Max/Min, Clip, Cast and
// the kiln.FusedElementwise program interpreter. Each computes what the reference kernel
// (src/kiln/reference/kernels/elementwise.cc) computes, in float32 rather than double (float64
// elements in double; float16 and bfloat16 are loaded into float and rounded once on the way
// back), so a transcendental result may differ in the last bits.
//
// Every kernel reads operand k at output element i through a BroadcastGeometry: the flat walk
// (each operand has the output's shape, or one element) or the strided walk (per-operand strides
// over the output's merged dimensions, 0 along broadcast ones). Kernels read element i of every
// operand before writing element i of the output and touch no other element, so an output may
// overwrite an input of its own shape.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>
#include <string>

namespace kiln::cuda {

// The element types of the kernels, one per ir::DType (bool is stored as one byte, 0 or 1).
enum class ElementType : int {
  kFloat32,
  kFloat16,
  kBFloat16,
  kFloat64,
  kInt64,
  kInt32,
  kInt16,
  kInt8,
  kUInt64,
  kUInt32,
  kUInt16,
  kUInt8,
  kBool,
};

int elementBytes(ElementType type);

constexpr int kMaxBroadcastRank = 8;
constexpr int kMaxBroadcastOperands = 8;

// How the operands of an elementwise kernel are read at each output element.
struct BroadcastGeometry {
  int64_t count = 0;  // output elements; 0 launches nothing
  int operands = 0;
  // Flat: operand k at element i is element i, or element 0 where scalar[k].
  bool flat = true;
  bool scalar[kMaxBroadcastOperands] = {};
  // Strided: element i's coordinates over `dims` (row-major, merged so that no two neighbouring
  // dimensions could be walked as one) give operand k's offset through strides[k].
  int rank = 0;
  int64_t dims[kMaxBroadcastRank] = {};
  int64_t strides[kMaxBroadcastOperands][kMaxBroadcastRank] = {};
  // Every element index and operand offset is below 2^30: the strided walk divides in 32 bits.
  bool narrowIndex = false;
};

// The flat geometry of `count` elements over `operands` operands of the output's shape.
BroadcastGeometry flatGeometry(int64_t count, int operands);

// --- Unary -------------------------------------------------------------------------------------

enum class UnaryOp : int {
  kAbs,
  kAcos,
  kAcosh,
  kAsin,
  kAsinh,
  kAtan,
  kAtanh,
  kBitwiseNot,
  kCeil,
  kCelu,  // alpha
  kCos,
  kCosh,
  kElu,  // alpha
  kErf,
  kExp,
  kFloor,
  kGelu,         // the erf form
  kGeluTanh,     // approximate = "tanh"
  kHardSigmoid,  // alpha, beta
  kHardSwish,
  kIsInf,  // alpha: detect_negative (0 or 1), beta: detect_positive
  kIsNaN,
  kLeakyRelu,  // alpha
  kLog,
  kMish,
  kNeg,
  kNot,
  kReciprocal,
  kRelu,
  kRound,   // halves to even
  kSelu,    // alpha, beta: gamma
  kShrink,  // alpha: lambd, beta: bias
  kSigmoid,
  kSign,
  kSin,
  kSinh,
  kSoftplus,
  kSoftsign,
  kSqrt,
  kTan,
  kTanh,
  kThresholdedRelu,  // alpha
};

struct UnaryLaunch {
  UnaryOp op = UnaryOp::kRelu;
  ElementType type = ElementType::kFloat32;  // the input's; IsNaN, IsInf and Not give bool
  float alpha = 0;
  float beta = 0;
  int64_t count = 0;
  // 4: each thread moves four elements as one aligned load and store (16 bytes for 4-byte
  // elements) on the flat walk, the last count % 4 one by one; 1: one element at a time.
  int vectorWidth = 4;
  const void* x = nullptr;
  void* y = nullptr;
  int blockThreads = 256;  // threads a block (cuda.eltwise.block): 128, 256, 512 or 1024
};

bool unarySupported(UnaryOp op, ElementType type);
cudaError_t launchUnary(const UnaryLaunch& launch, cudaStream_t stream);

// --- Binary ------------------------------------------------------------------------------------

enum class BinaryOp : int {
  kAdd,
  kSub,
  kMul,
  kDiv,   // integers truncate; an integer division by zero gives 0 (the reference refuses it)
  kMod,   // integers, the divisor's sign (Python's %); by zero gives 0
  kFmod,  // the dividend's sign (C's fmod and %); an integer modulo zero gives 0
  kPRelu,
  kMax,  // NaN-propagating
  kMin,
  kEqual,  // comparisons give bool
  kLess,
  kLessOrEqual,
  kGreater,
  kGreaterOrEqual,
  kAnd,  // bool
  kOr,
  kXor,
  kBitwiseAnd,
  kBitwiseOr,
  kBitwiseXor,
  kShiftLeft,  // unsigned; shifting by the width or more gives 0
  kShiftRight,
};

struct BinaryLaunch {
  BinaryOp op = BinaryOp::kAdd;
  ElementType type = ElementType::kFloat32;  // both inputs'
  BroadcastGeometry geometry;                // two operands
  int vectorWidth = 4;
  const void* a = nullptr;
  const void* b = nullptr;
  void* y = nullptr;
  int blockThreads = 256;  // threads a block (cuda.eltwise.block): 128, 256, 512 or 1024
};

bool binarySupported(BinaryOp op, ElementType type);
bool binaryGivesBool(BinaryOp op);
cudaError_t launchBinary(const BinaryLaunch& launch, cudaStream_t stream);

// Pow: the output has the base's type. Integer powers of integers wrap; a floating base or
// exponent computes in floating point (float powf for float^float, double otherwise).
struct PowLaunch {
  ElementType base = ElementType::kFloat32;
  ElementType exponent = ElementType::kFloat32;
  BroadcastGeometry geometry;
  const void* a = nullptr;
  const void* b = nullptr;
  void* y = nullptr;
  int blockThreads = 256;  // threads a block (cuda.eltwise.block): 128, 256, 512 or 1024
};

bool powSupported(ElementType base, ElementType exponent);
cudaError_t launchPow(const PowLaunch& launch, cudaStream_t stream);

// --- Where, variadic ---------------------------------------------------------------------------

// y = condition ? x : y, copying elements of `elementBytes` (1, 2, 4 or 8) bytes.
struct WhereLaunch {
  int elementBytes = 4;
  BroadcastGeometry geometry;  // three operands: condition, x, y
  const void* condition = nullptr;
  const void* x = nullptr;
  const void* y = nullptr;
  void* out = nullptr;
  int blockThreads = 256;  // threads a block (cuda.eltwise.block): 128, 256, 512 or 1024
};

cudaError_t launchWhere(const WhereLaunch& launch, cudaStream_t stream);

enum class VariadicOp : int { kSum, kMean, kMax, kMin };

// Folds 1 to kMaxBroadcastOperands inputs, each broadcast to the output. Floating sums accumulate
// in double, as the reference's.
struct VariadicLaunch {
  VariadicOp op = VariadicOp::kSum;
  ElementType type = ElementType::kFloat32;
  BroadcastGeometry geometry;  // geometry.operands inputs
  const void* inputs[kMaxBroadcastOperands] = {};
  void* y = nullptr;
  int blockThreads = 256;  // threads a block (cuda.eltwise.block): 128, 256, 512 or 1024
};

bool variadicSupported(VariadicOp op, ElementType type);
cudaError_t launchVariadic(const VariadicLaunch& launch, cudaStream_t stream);

// --- Clip, Cast --------------------------------------------------------------------------------

// y = x clamped to [min, max]: min first, then max (min > max gives max); NaN stays NaN. A bound
// is read from `min`/`max` (a device scalar of `type`: a runtime or constant input) where given;
// else a floating type takes floatMin/floatMax (the opset < 11 attributes, or no bound) and an
// integer type its own limits (no bound).
struct ClipLaunch {
  ElementType type = ElementType::kFloat32;
  int64_t count = 0;
  int vectorWidth = 4;
  const void* x = nullptr;
  void* y = nullptr;
  const void* min = nullptr;
  const void* max = nullptr;
  double floatMin = -std::numeric_limits<double>::infinity();
  double floatMax = std::numeric_limits<double>::infinity();
  int blockThreads = 256;  // threads a block (cuda.eltwise.block): 128, 256, 512 or 1024
};

bool clipSupported(ElementType type);
cudaError_t launchClip(const ClipLaunch& launch, cudaStream_t stream);

// Conversion as the reference's Cast: floating to integer truncates toward zero, saturating, with
// NaN to 0; to a floating type rounds to nearest even (overflow to infinity); integers wrap;
// anything nonzero (NaN included) is true.
struct CastLaunch {
  ElementType from = ElementType::kFloat32;
  ElementType to = ElementType::kFloat32;
  int64_t count = 0;
  int vectorWidth = 4;
  const void* x = nullptr;
  void* y = nullptr;
  int blockThreads = 256;  // threads a block (cuda.eltwise.block): 128, 256, 512 or 1024
};

bool castSupported(ElementType from, ElementType to);
cudaError_t launchCast(const CastLaunch& launch, cudaStream_t stream);

// --- kiln.FusedElementwise ---------------------------------------------------------------------

// ir::EltwiseOpcode (src/kiln/ir/ops/fused_elementwise.h), one for one.
enum class FusedOpcode : uint8_t {
  kRelu,
  kSigmoid,
  kTanh,
  kExp,
  kLog,
  kSqrt,
  kNeg,
  kAbs,
  kErf,
  kReciprocal,
  kHardSigmoid,
  kHardSwish,
  kLeakyRelu,
  kClip,
  kGelu,
  kGeluTanh,
  kAdd,
  kSub,
  kMul,
  kDiv,
  kPow,
  kMax,
  kMin,
};

constexpr int kMaxFusedInstructions = 32;

struct FusedInstruction {
  FusedOpcode opcode = FusedOpcode::kRelu;
  uint8_t operandCount = 1;
  // Input k as k (0 <= k < kMaxBroadcastOperands); instruction j's value as -1 - j.
  int8_t operands[2] = {0, 0};
  float params[2] = {0, 0};
};

struct FusedProgram {
  int length = 0;
  FusedInstruction code[kMaxFusedInstructions];
};

// Runs `program` at every output element, each instruction computed in float32 (as the
// reference rounds each to float32). The inputs and the output all have `type`: float32, or
// float16 / bfloat16 where cuda.precision made the node reduced (loaded into float, the result
// rounded once).
struct FusedLaunch {
  FusedProgram program;
  ElementType type = ElementType::kFloat32;
  BroadcastGeometry geometry;  // geometry.operands inputs
  int vectorWidth = 4;
  const void* inputs[kMaxBroadcastOperands] = {};
  void* y = nullptr;
  int blockThreads = 256;  // threads a block (cuda.eltwise.block): 128, 256, 512 or 1024
};

bool fusedSupported(ElementType type);

cudaError_t launchFused(const FusedLaunch& launch, cudaStream_t stream);

}  // namespace kiln::cuda
