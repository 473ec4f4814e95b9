// The CPU backend's kernel families. Each factory returns null when its kernels do not apply to
// the node (dtype, attributes) or the route picks another tactic for it; lowering then tries the
// next family and finally the reference kernel.
#pragma once

#include <memory>

#include "kiln/backends/cpu/plan.h"

namespace kiln::cpu {

std::unique_ptr<Step> makeGemmStep(const ir::Node& node, const knobs::Route& route);
std::unique_ptr<Step> makeConvStep(const ir::Node& node, const knobs::Route& route);
// Runs the node with the reference executor's kernel, over arena views: correct for every op,
// fast for none. Its tactic is "reference".
std::unique_ptr<Step> makeReferenceStep(const ir::Node& node);

}  // namespace kiln::cpu
