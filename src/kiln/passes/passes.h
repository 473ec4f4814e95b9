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

// --- pattern recognition and simplification (recognize_*.cc, simplify_*.cc) ---
// --- end pattern recognition ---

// --- fusion (fold_batchnorm.cc, fuse_*.cc) ---
// --- end fusion ---

extern const knobs::Knob kEliminateDeadNodes;
Status eliminateDeadNodes(ir::Graph& graph, PassContext& context);

}  // namespace kiln::passes
