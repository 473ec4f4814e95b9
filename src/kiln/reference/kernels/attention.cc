// Reference kernel for kiln.Attention (src/kiln/ir/ops/attention.h): for each batch entry, the
// scores scale * Q · K' + mask, a max-subtracted softmax over each row, then the product with V,
// all in double.
#include <cmath>
#include <limits>

#include "kiln/ir/op_schema.h"
#include "kiln/ir/ops/attention.h"
#include "kiln/reference/kernels/neural.h"

namespace kiln::reference {

namespace {

Status runAttention(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const ir::AttentionGeometry g, ir::attentionGeometry(ctx.node()));
  // The packed heads form reads K and V from input 0 too.
  const std::vector<double> q = readAsDouble(ctx.input(0));
  const std::vector<double> kStore = g.packed ? std::vector<double>() : readAsDouble(ctx.input(1));
  const std::vector<double> vStore = g.packed ? std::vector<double>() : readAsDouble(ctx.input(2));
  const std::vector<double>& k = g.packed ? q : kStore;
  const std::vector<double>& v = g.packed ? q : vStore;
  std::vector<double> mask;
  if (g.hasMask) mask = readAsDouble(ctx.input(3));
  std::vector<double> y(static_cast<size_t>(g.output.elementCount()), 0.0);
  std::vector<double> row(static_cast<size_t>(g.skv));
  for (int64_t b = 0; b < g.batch; ++b) {
    const double* qb = q.data() + g.q.offset(b, g.heads);
    const double* kb = k.data() + g.k.offset(b, g.heads);
    const double* vb = v.data() + g.v.offset(b, g.heads);
    for (int64_t i = 0; i < g.sq; ++i) {
      double max = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < g.skv; ++j) {
        double dot = 0;
        for (int64_t e = 0; e < g.d; ++e) {
          // K' [D, Skv] holds (e, j) in row e, column j; K [Skv, D] in row j, column e.
          dot += qb[i * g.q.rowStride + e] *
                 kb[g.transposeK ? j * g.k.rowStride + e : e * g.k.rowStride + j];
        }
        double score = g.scale * dot;
        if (g.hasMask) {
          score += mask[static_cast<size_t>(g.maskBatchOffsets[static_cast<size_t>(b)] +
                                            i * g.maskRowStride + j * g.maskColumnStride)];
        }
        row[static_cast<size_t>(j)] = score;
        max = std::max(max, score);
      }
      // Subtracting the maximum keeps exp from overflowing; a row of -inf gives NaN (0 / 0),
      // as the unfused Softmax does.
      double sum = 0;
      for (double& value : row) {
        value = std::exp(value - max);
        sum += value;
      }
      double* out = y.data() + g.y.offset(b, g.heads) + i * g.y.rowStride;
      for (int64_t j = 0; j < g.skv; ++j) {
        double p = row[static_cast<size_t>(j)] / sum;
        if (g.nanToZero && std::isnan(p)) p = 0;
        for (int64_t e = 0; e < g.dv; ++e) out[e] += p * vb[j * g.v.rowStride + e];
      }
    }
  }
  writeFromDouble(ctx.output(0), y);
  return Status::ok();
}

}  // namespace

void registerAttentionKernels(KernelRegistry& registry) {
  registry.add("Attention", runAttention, ir::kKilnDomain);
}

}  // namespace kiln::reference
