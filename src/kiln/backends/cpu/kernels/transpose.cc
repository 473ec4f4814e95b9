// Transpose of any rank and dtype (moved by element size): axes that stay adjacent are merged
// at build time, and the last two output axes are copied in square tiles so that both the
// reads and the writes stay within a few cache lines; where the output has only 2 to 4 columns
// read from contiguous planes (an image's channels moved last), the planes are interleaved
// instead. The work is split over the threads by bands of `tile` output rows (each band a
// contiguous range of the output).
#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>

#include "kiln/backends/cpu/kernels/steps.h"

namespace kiln::cpu {

const knobs::Knob kTransposeImpl = knobs::declareKnob({
    .name = "cpu.transpose.impl",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"fast", "reference"},
    .defaultValue = "fast",
    .help = "Transpose: merged axes and tiled copies, or the reference kernel",
    .backends = {"cpu"},
    .perNode = true,
});

constexpr const char* kDefaultTile = "32";
const knobs::Knob kTransposeTile = knobs::declareKnob({
    .name = "cpu.transpose.tile",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"16", "32", "64"},
    .defaultValue = kDefaultTile,
    .help = "16: Transpose copies its last two axes in 16x16 tiles; 32: in 32x32 tiles; 64: in "
            "64x64 tiles",
    .backends = {"cpu"},
    .perNode = true,
});

namespace {

// The transpose after merging: output axis i has extent dims[i] and advances the input by
// strides[i] elements.
struct Walk {
  std::vector<int64_t> dims;
  std::vector<int64_t> strides;
};

Walk simplify(const ir::Shape& input, const std::vector<int64_t>& perm) {
  const size_t rank = input.rank();
  std::vector<int64_t> inputStrides(rank, 1);
  for (size_t i = rank; i-- > 1;) inputStrides[i - 1] = inputStrides[i] * input[i];
  Walk walk;
  for (size_t i = 0; i < rank; ++i) {
    const size_t axis = static_cast<size_t>(perm[i]);
    const int64_t dim = input[axis];
    if (dim == 1) continue;  // size-1 axes move nothing
    const int64_t stride = inputStrides[axis];
    // An output axis whose input stride times extent is the previous one's stride continues it.
    if (!walk.dims.empty() && walk.strides.back() == stride * dim) {
      walk.dims.back() *= dim;
      walk.strides.back() = stride;
      continue;
    }
    walk.dims.push_back(dim);
    walk.strides.push_back(stride);
  }
  return walk;
}

// The least copying (bytes) worth a chunk of its own on another thread: the box copies' default
// (cpu.copy.chunk).
constexpr int64_t kChunkBytes = 64 * 1024;

template <typename T>
class TransposeStep : public Step {
 public:
  TransposeStep(Walk walk, int64_t tile) : walk_(std::move(walk)), tile_(tile) {}

  Status run(const ExecutionContext& context) const override {
    const T* x = context.data<T>(*inputs[0]);
    T* y = context.data<T>(*outputs[0]);
    const size_t rank = walk_.dims.size();
    if (rank == 0 || (rank == 1 && walk_.strides[0] == 1)) {
      std::memcpy(y, x, static_cast<size_t>(outputs[0]->bytes()));
      return Status::ok();
    }
    if (rank == 1) {  // cannot happen after merging, but keeps the walk below total
      for (int64_t i = 0; i < walk_.dims[0]; ++i) y[i] = x[i * walk_.strides[0]];
      return Status::ok();
    }
    // Outer axes: all but the last two. A unit of work is a band of up to `tile` rows of one
    // outer index; the units go to the threads in contiguous ranges.
    const int64_t rows = walk_.dims[rank - 2], cols = walk_.dims[rank - 1];
    const int64_t rowStride = walk_.strides[rank - 2], colStride = walk_.strides[rank - 1];
    int64_t outer = 1;
    for (size_t i = 0; i + 2 < rank; ++i) outer *= walk_.dims[i];
    const int64_t bands = (rows + tile_ - 1) / tile_;
    const int64_t bandBytes = tile_ * cols * static_cast<int64_t>(sizeof(T));
    context.pool().parallelFor(
        outer * bands, std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(bandBytes, 1)),
        [&](int64_t begin, int64_t end) {
          for (int64_t unit = begin; unit < end; ++unit) {
            const int64_t o = unit / bands, band = unit % bands;
            int64_t inputOffset = 0;
            for (int64_t rest = o, d = static_cast<int64_t>(rank) - 3; d >= 0; --d) {
              const int64_t extent = walk_.dims[static_cast<size_t>(d)];
              inputOffset += (rest % extent) * walk_.strides[static_cast<size_t>(d)];
              rest /= extent;
            }
            const int64_t r0 = band * tile_, r1 = std::min(rows, r0 + tile_);
            copyTile(x + inputOffset + r0 * rowStride, y + (o * rows + r0) * cols, r1 - r0, cols,
                     rowStride, colStride, tile_);
          }
        });
    return Status::ok();
  }

 private:
  static void copyTile(const T* x, T* y, int64_t rows, int64_t cols, int64_t rowStride,
                       int64_t colStride, int64_t tile) {
    if (colStride == 1) {
      for (int64_t r = 0; r < rows; ++r) {
        std::memcpy(y + r * cols, x + r * rowStride, static_cast<size_t>(cols) * sizeof(T));
      }
      return;
    }
    if (rowStride == 1) {
      switch (cols) {  // few columns (NCHW -> NHWC of an image's 3 channels): interleave planes
        case 2:
          return interleave<2>(x, y, rows, colStride);
        case 3:
          return interleave<3>(x, y, rows, colStride);
        case 4:
          return interleave<4>(x, y, rows, colStride);
        default:
          break;
      }
    }
    for (int64_t r0 = 0; r0 < rows; r0 += tile) {
      const int64_t r1 = std::min(rows, r0 + tile);
      for (int64_t c0 = 0; c0 < cols; c0 += tile) {
        const int64_t c1 = std::min(cols, c0 + tile);
        for (int64_t r = r0; r < r1; ++r) {
          const T* in = x + r * rowStride;
          T* out = y + r * cols;
          for (int64_t c = c0; c < c1; ++c) out[c] = in[c * colStride];
        }
      }
    }
  }

  // y[r, c] = x[c, r] for kCols planes of `rows` contiguous elements `planeStride` apart: each
  // plane read in order, the output written in order, kCols known so the loop vectorises into
  // loads and shuffles (a 32x32 tile of 3 columns wastes most of its work).
  template <int kCols>
  static void interleave(const T* x, T* y, int64_t rows, int64_t planeStride) {
    const T* planes[kCols];
    for (int c = 0; c < kCols; ++c) planes[c] = x + c * planeStride;
    for (int64_t r = 0; r < rows; ++r) {
      for (int c = 0; c < kCols; ++c) y[r * kCols + c] = planes[c][r];
    }
  }

  Walk walk_;
  int64_t tile_;  // rows and columns of a copied tile (cpu.transpose.tile)
};

}  // namespace

std::unique_ptr<Step> makeTransposeStep(const ir::Node& node, const knobs::Route& route) {
  if (!node.domain.empty() || node.opType != "Transpose") return nullptr;
  if (route.value(kTransposeImpl, &node) != "fast") return nullptr;
  const ir::Value* x = node.inputs[0];
  const size_t rank = x->shape.rank();
  std::vector<int64_t> reversed(rank);
  std::iota(reversed.rbegin(), reversed.rend(), 0);
  auto perm = node.getInts("perm", reversed);
  if (!perm.isOk() || perm->size() != rank) return nullptr;
  std::vector<bool> seen(rank, false);
  for (int64_t& axis : *perm) {
    if (axis < 0) axis += static_cast<int64_t>(rank);
    if (axis < 0 || axis >= static_cast<int64_t>(rank) || seen[static_cast<size_t>(axis)]) {
      return nullptr;
    }
    seen[static_cast<size_t>(axis)] = true;
  }
  Walk walk = simplify(x->shape, *perm);
  const std::string tile = route.value(kTransposeTile, &node);
  const int64_t tileSize = std::stoll(tile);
  std::unique_ptr<Step> step;
  switch (ir::dtypeSize(x->dtype)) {
    case 1:
      step = std::make_unique<TransposeStep<uint8_t>>(std::move(walk), tileSize);
      break;
    case 2:
      step = std::make_unique<TransposeStep<uint16_t>>(std::move(walk), tileSize);
      break;
    case 4:
      step = std::make_unique<TransposeStep<uint32_t>>(std::move(walk), tileSize);
      break;
    case 8:
      step = std::make_unique<TransposeStep<uint64_t>>(std::move(walk), tileSize);
      break;
    default:
      return nullptr;
  }
  step->tactic = "fast.transpose_tiled" + (tile == kDefaultTile ? "" : ".t" + tile);
  return step;
}

}  // namespace kiln::cpu
