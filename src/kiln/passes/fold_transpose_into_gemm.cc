// Folds a Transpose that swaps the two axes of a matrix into the Gemm that reads it (Gemm's
// transA/transB flip), and turns a matrix MatMul that reads such a Transpose into a Gemm that
// reads the untransposed matrix: BLAS reads either layout, so the transposed copy is never
// written. (A Transpose of a constant weight is already folded by fold_constants; batched
// MatMuls have no transposed-operand kernel and stay as they are.)
//
//   %t = Transpose(%k) {perm=[1,0]}; %y = MatMul "mm" (%q, %t)
//     =>   %y = Gemm "mm" (%q, %k) {transB=1}
#include <unordered_set>

#include "kiln/passes/passes.h"

namespace kiln::passes {

const knobs::Knob kFoldTransposeIntoGemm = knobs::declareKnob({
    .name = "graph.fold_transpose_into_gemm",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "read a transposed matrix operand of Gemm (or of a 2-D MatMul, which becomes a Gemm) "
            "through transA/transB instead of a Transpose",
});

namespace {

// The matrix `value` is the transpose of, when a Transpose swapping the axes of a 2-D tensor
// produces it.
ir::Value* transposedMatrix(const ir::Value* value) {
  const ir::Node* transpose = value ? value->producer : nullptr;
  if (!transpose || !transpose->domain.empty() || transpose->opType != "Transpose" ||
      !transpose->input(0) || transpose->inputs[0]->shape.rank() != 2) {
    return nullptr;
  }
  // Without perm, Transpose reverses the axes: [1, 0] for a matrix.
  auto perm = transpose->getInts("perm", {1, 0});
  if (!perm.isOk() || *perm != std::vector<int64_t>{1, 0}) return nullptr;
  return transpose->inputs[0];
}

// Whether `node` is a Gemm, or a MatMul of two matrices that a Gemm without C can replace
// (C is optional from opset 11 on).
bool isMatrixProduct(const ir::Node& node) {
  if (!node.domain.empty() || !node.input(0) || !node.input(1)) return false;
  if (node.opType == "Gemm") return true;
  return node.opType == "MatMul" && node.opsetVersion >= 11 && node.inputs[0]->shape.rank() == 2 &&
         node.inputs[1]->shape.rank() == 2;
}

}  // namespace

Status foldTransposeIntoGemm(ir::Graph& graph, PassContext& context) {
  std::vector<const ir::Node*> bypassed;
  for (const auto& nodePtr : graph.nodes()) {
    ir::Node& node = *nodePtr;
    if (!isMatrixProduct(node)) continue;
    ir::Value* a = transposedMatrix(node.inputs[0]);
    ir::Value* b = transposedMatrix(node.inputs[1]);
    if (!a && !b) continue;
    auto transA = node.getInt("transA", 0);
    auto transB = node.getInt("transB", 0);
    if (!transA.isOk() || !transB.isOk()) continue;
    const std::string from = node.opType;
    // A MatMul becomes the Gemm it equals (alpha 1, no C) in place, keeping its name for
    // per-node knobs.
    node.opType = "Gemm";
    ir::Value* untransposed[2] = {a, b};
    const int64_t trans[2] = {*transA, *transB};
    const char* flags[2] = {"transA", "transB"};
    for (size_t i = 0; i < 2; ++i) {
      if (!untransposed[i]) continue;
      bypassed.push_back(node.inputs[i]->producer);
      node.inputs[i] = untransposed[i];
      node.attributes[flags[i]] = ir::Attribute{int64_t{trans[i] == 0 ? 1 : 0}};
    }
    context.note("folded Transpose into {} '{}'{}", from, node.name,
                 from == "MatMul" ? " (now a Gemm)" : "");
  }
  // The Transposes go when nothing else reads them.
  std::unordered_set<const ir::Node*> removed;
  for (const ir::Node* transpose : bypassed) {
    const ir::Value* out = transpose->outputs[0];
    if (!graph.isGraphOutput(out) && graph.consumers(out).empty()) removed.insert(transpose);
  }
  graph.removeNodes([&](const ir::Node& node) { return removed.count(&node) > 0; });
  return Status::ok();
}

}  // namespace kiln::passes
