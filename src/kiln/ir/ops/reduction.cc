// Shape inference for the reduction ops.
#include "kiln/ir/op_schema.h"

namespace kiln::ir {

void registerReductionSchemas(OpRegistry& registry) { (void)registry; }

}  // namespace kiln::ir
