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
    // After folding, which makes the pads, steps and operands that decide a no-op constants;
    // before CSE and the patterns, which then see through the no-ops.
    {"eliminate_noops", &kEliminateNoops, eliminateNoops},
    // After no-op removal (x * 1 * c is x * c already); before CSE, which then compares the
    // combined steps.
    {"reassociate_constants", &kReassociateConstants, reassociateConstants},
    // After folding, which makes the Slices' starts and ends constants, and no-op removal, which
    // turns a whole-tensor Slice into the tensor itself (a Concat input it accepts); before CSE,
    // which could merge equal Slices of two Concats into one Slice with two readers (no longer
    // absorbable), and which then merges equal Gathers instead; before layout and fusion.
    {"concat_slices_to_gather", &kConcatSlicesToGather, concatSlicesToGather},
    // After folding and no-op removal, so equal computations read the very same values; before
    // the patterns, so each repeated subgraph is matched and rewritten once.
    {"eliminate_common_subexpressions", &kEliminateCommonSubexpressions,
     eliminateCommonSubexpressions},
    // --- pattern recognition and simplification ---
    // After folding, which turns exporters' computed shapes into the constants these rewrites
    // need; before the recognizers, whose patterns such layout chains can split.
    {"simplify_transpose_reshape", &kSimplifyTransposeReshape, simplifyTransposeReshape},
    // After Transpose pairs cancel above; before fuse_gemm_activation, which then fuses the
    // activation after the Gemm a 2-D MatMul becomes.
    {"fold_transpose_into_gemm", &kFoldTransposeIntoGemm, foldTransposeIntoGemm},
    // Recognizers after folding, so eps, gamma, beta and the GELU constants are constants; before
    // fusion, which then sees one LayerNormalization or Gelu node instead of a chain.
    {"recognize_layernorm", &kRecognizeLayerNorm, recognizeLayerNorm},
    {"recognize_gelu", &kRecognizeGelu, recognizeGelu},
    // After folding (the scales are constants then) and fold_transpose_into_gemm (whose Gemm it
    // reads as a 2-D Q*K^T); before fuse_elementwise, which would merge the scale Mul, the mask Add
    // and the Where(IsNaN) into FusedElementwise chains and so hide the pattern.
    {"fuse_attention", &kFuseAttention, fuseAttention},
    // Right after fuse_attention, on the nodes it made: the Reshape / Transpose pairs around
    // them go; eliminate_dead_nodes removes what they leave unread.
    {"attention_heads", &kAttentionHeads, attentionHeads},
    // After concat_slices_to_gather (a roll is a Gather then), simplify_transpose_reshape (the
    // Transpose pairs that cancel are gone) and attention_heads (which takes the head
    // Transposes around attention for itself); before the fusions and layout_nhwc.
    {"compose_row_moves", &kComposeRowMoves, composeRowMoves},
    // --- end pattern recognition ---
    // --- fusion ---
    // Before the activation fusions: a BatchNormalization between Conv and Relu hides the pair.
    {"fold_batchnorm", &kFoldBatchNorm, foldBatchNorm},
    // Before fuse_conv_activation, which matches the Conv (not the Pad) before an activation.
    {"fold_pad_into_conv", &kFoldPadIntoConv, foldPadIntoConv},
    // After BN folding (a Mul/Add after a folded BN then follows the Conv directly); before the
    // fusions, which then find the activation right after the Conv or MatMul.
    {"fold_affine_into_conv", &kFoldAffineIntoConv, foldAffineIntoConv},
    // After BN folding and the affine folds, which need the Conv whole (a scale after the sum of
    // parts no longer folds); before fuse_conv_activation, which takes the parts' sum Adds as
    // residuals and the activation after them. No gate knob: fusion.concat_into_conv is an enum
    // the pass reads per Concat.
    {"dissolve_channel_concat", nullptr, dissolveChannelConcat},
    // After BN folding (Conv -> Relu is then adjacent); absorbs bias/residual Adds + activation.
    {"fuse_conv_activation", &kFuseConvActivation, fuseConvActivation},
    // After BN folding too (Gemm + BN folds into Gemm first); MatMul + Add + act -> FusedGemm.
    {"fuse_gemm_activation", &kFuseGemmActivation, fuseGemmActivation},
    // After the Conv fusions (NhwcConv carries FusedConv's epilogue); before fuse_elementwise,
    // whose fused chains the layout could not follow through as it follows plain elementwise ops.
    // No gate knob: graph.layout on the CPU (NCHW by default) and cuda.layout on the GPU (NHWC
    // by default) say which nodes it changes.
    {"layout_nhwc", nullptr, layoutNhwc},
    // Right after layout_nhwc, on the NhwcConvs it made (CUDA only); no gate knob:
    // cuda.conv.pad_channels is an enum read per convolution.
    {"pad_conv_channels", nullptr, padConvChannels},
    // After layout_nhwc, which carries ShuffleNet's shuffles into NHWC (their copies are then
    // along the contiguous channels); before fuse_elementwise, which never reads these nodes.
    {"fuse_channel_shuffle", &kFuseChannelShuffle, fuseChannelShuffle},
    // Before fuse_elementwise, which would take the residual Add into an elementwise chain; after
    // the Conv and Gemm fusions, which take the Adds that are their epilogues'.
    {"fuse_add_layernorm", &kFuseAddLayerNorm, fuseAddLayerNorm},
    // Last of the fusions: Conv and Gemm first absorb the activations and Adds they can (that
    // saves a whole pass over memory); what is left chains into FusedElementwise.
    {"fuse_elementwise", &kFuseElementwise, fuseElementwise},
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
    KILN_ASSIGN_OR_RETURN(PassRecord record, runPass(pass, graph, route, options.backend));
    records.push_back(std::move(record));
    if (options.dump && (options.dumpAfter == "all" || options.dumpAfter == pass.name)) {
      options.dump(pass.name, graph);
    }
  }
  return records;
}

}  // namespace kiln::passes
