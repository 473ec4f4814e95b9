// Every graph pass of kiln, one file each in src/kiln/passes/, with the knob that gates it
// declared beside its code. pipeline.cc orders them.
#pragma once

#include "kiln/knobs/knob.h"
#include "kiln/passes/pass.h"

namespace kiln::passes {

extern const knobs::Knob kFoldConstants;
Status foldConstants(ir::Graph& graph, PassContext& context);

extern const knobs::Knob kEliminateIdentity;
Status eliminateIdentity(ir::Graph& graph, PassContext& context);

// --- clean-up after folding (eliminate_noops.cc, reassociate_constants.cc,
// eliminate_common_subexpressions.cc) ---
extern const knobs::Knob kEliminateNoops;
Status eliminateNoops(ir::Graph& graph, PassContext& context);

extern const knobs::Knob kReassociateConstants;
Status reassociateConstants(ir::Graph& graph, PassContext& context);

// A Concat of Slices of one tensor along one axis (torch.roll as exported) becomes one Gather
// (concat_slices_to_gather.cc).
extern const knobs::Knob kConcatSlicesToGather;
Status concatSlicesToGather(ir::Graph& graph, PassContext& context);

// A chain of Gathers, Transposes and reshapes that keep the last axis whole (Swin's shift and
// window partition) becomes one Gather of rows (compose_row_moves.cc).
extern const knobs::Knob kComposeRowMoves;
Status composeRowMoves(ir::Graph& graph, PassContext& context);

extern const knobs::Knob kEliminateCommonSubexpressions;
Status eliminateCommonSubexpressions(ir::Graph& graph, PassContext& context);
// --- end clean-up ---

// --- pattern recognition and simplification (recognize_*.cc, simplify_*.cc) ---
// In pipeline order. Exporters write redundant layout chains (Transpose pairs, Reshape after
// Squeeze) and spell LayerNormalization and GELU out as elementwise chains; one node each runs
// faster and gives the fusions one node to match.
extern const knobs::Knob kSimplifyTransposeReshape;
Status simplifyTransposeReshape(ir::Graph& graph, PassContext& context);

extern const knobs::Knob kRecognizeLayerNorm;
Status recognizeLayerNorm(ir::Graph& graph, PassContext& context);

extern const knobs::Knob kRecognizeGelu;
Status recognizeGelu(ir::Graph& graph, PassContext& context);

extern const knobs::Knob kFoldTransposeIntoGemm;
Status foldTransposeIntoGemm(ir::Graph& graph, PassContext& context);

extern const knobs::Knob kFuseAttention;
Status fuseAttention(ir::Graph& graph, PassContext& context);

// kiln.Attention reads its heads where the projections wrote them (attention_heads.cc).
extern const knobs::Knob kAttentionHeads;
Status attentionHeads(ir::Graph& graph, PassContext& context);
// --- end pattern recognition ---

// --- fusion (fold_batchnorm.cc, fuse_*.cc) ---
// In pipeline order: BN folding first exposes Conv -> activation pairs to the fusions.
extern const knobs::Knob kFoldBatchNorm;
Status foldBatchNorm(ir::Graph& graph, PassContext& context);

extern const knobs::Knob kFoldPadIntoConv;
Status foldPadIntoConv(ir::Graph& graph, PassContext& context);

extern const knobs::Knob kFoldAffineIntoConv;
Status foldAffineIntoConv(ir::Graph& graph, PassContext& context);

// A channel Concat that only convolutions read, split into one convolution per part
// (dissolve_channel_concat.cc); CPU only.
extern const knobs::Knob kDissolveChannelConcat;
Status dissolveChannelConcat(ir::Graph& graph, PassContext& context);

extern const knobs::Knob kFuseConvActivation;
extern const knobs::Knob kFuseConvResidual;
Status fuseConvActivation(ir::Graph& graph, PassContext& context);

extern const knobs::Knob kFuseGemmActivation;
Status fuseGemmActivation(ir::Graph& graph, PassContext& context);

Status layoutNhwc(ir::Graph& graph, PassContext& context);

// An NHWC convolution's input channels zero-padded to a multiple of 4 or 8 on the GPU
// (pad_conv_channels.cc); no gate knob: cuda.conv.pad_channels is an enum.
extern const knobs::Knob kPadConvChannels;
Status padConvChannels(ir::Graph& graph, PassContext& context);

// A channel shuffle (with its Concat and Split) as one kiln.ChannelShuffle copy
// (fuse_channel_shuffle.cc); CPU only.
extern const knobs::Knob kFuseChannelShuffle;
Status fuseChannelShuffle(ir::Graph& graph, PassContext& context);

// A residual Add into the LayerNormalization after it (fuse_add_layernorm.cc).
extern const knobs::Knob kFuseAddLayerNorm;
Status fuseAddLayerNorm(ir::Graph& graph, PassContext& context);

extern const knobs::Knob kFuseElementwise;
Status fuseElementwise(ir::Graph& graph, PassContext& context);

// The attributes (activation, activation_alpha, activation_beta) with which FusedConv and
// FusedGemm apply `node` to their result, or nothing when `node` is not an activation they
// apply exactly. Defined in fuse_conv_activation.cc; both fusions share it so the two ops agree.
std::optional<std::map<std::string, ir::Attribute>> fusedActivationAttributes(const ir::Node& node);
// --- end fusion ---

extern const knobs::Knob kEliminateDeadNodes;
Status eliminateDeadNodes(ir::Graph& graph, PassContext& context);

}  // namespace kiln::passes
