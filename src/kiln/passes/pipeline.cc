// The pipeline, in order. Each entry says why it sits where it does.
#include "kiln/passes/pipeline.h"

#include "kiln/passes/passes.h"

namespace kiln::passes {

namespace {

const PassInfo kPipeline[] = {
    // Identity and Dropout first: they hide the producer/consumer pairs every later pattern
    // matches on.
    {"eliminate_identity", &kEliminateIdentity, eliminateIdentity},
    // Fold before matching patterns: exporters compute shapes and constant weight transforms
    // with small subgraphs, and folding turns them into the initializers patterns look for.
    {"fold_constants", &kFoldConstants, foldConstants},
    // --- pattern recognition and simplification ---
    // After folding, which turns exporters' computed shapes into the constants these rewrites
    // need; before the recognizers, whose patterns such layout chains can split.
    {"simplify_transpose_reshape", &kSimplifyTransposeReshape, simplifyTransposeReshape},
    // Recognizers after folding, so eps, gamma, beta and the GELU constants are constants; before
    // fusion, which then sees one LayerNormalization or Gelu node instead of a chain.
    {"recognize_layernorm", &kRecognizeLayerNorm, recognizeLayerNorm},
    {"recognize_gelu", &kRecognizeGelu, recognizeGelu},
    // --- end pattern recognition ---
    // --- fusion ---
    // Before the activation fusions: a BatchNormalization between Conv and Relu hides the pair.
    {"fold_batchnorm", &kFoldBatchNorm, foldBatchNorm},
    // After BN folding (Conv -> Relu is then adjacent); absorbs bias/residual Adds + activation.
    {"fuse_conv_activation", &kFuseConvActivation, fuseConvActivation},
    // After BN folding too (Gemm + BN folds into Gemm first); MatMul + Add + act -> FusedGemm.
    {"fuse_gemm_activation", &kFuseGemmActivation, fuseGemmActivation},
    // --- end fusion ---
    // Last: the rewrites above leave nodes whose outputs nothing reads.
    {"eliminate_dead_nodes", &kEliminateDeadNodes, eliminateDeadNodes},
};

}  // namespace

std::span<const PassInfo> pipelinePasses() { return kPipeline; }

const PassInfo* findPass(const std::string& name) {
  for (const PassInfo& pass : kPipeline) {
    if (name == pass.name) return &pass;
  }
  return nullptr;
}

Result<std::vector<PassRecord>> runPipeline(ir::Graph& graph, const knobs::Route& route,
                                            const PipelineOptions& options) {
  if (!options.dumpAfter.empty() && options.dumpAfter != "all" && !findPass(options.dumpAfter)) {
    std::vector<std::string> names;
    for (const PassInfo& pass : kPipeline) names.push_back(pass.name);
    return invalidInput("--dump-ir-after names no pass '{}' (passes: {})", options.dumpAfter,
                        fmt::join(names, ", "));
  }
  std::vector<PassRecord> records;
  for (const PassInfo& pass : kPipeline) {
    KILN_ASSIGN_OR_RETURN(PassRecord record, runPass(pass, graph, route));
    records.push_back(std::move(record));
    if (options.dump && (options.dumpAfter == "all" || options.dumpAfter == pass.name)) {
      options.dump(pass.name, graph);
    }
  }
  return records;
}

}  // namespace kiln::passes
