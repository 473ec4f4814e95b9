// Shape inference for the shape ops.
#include "kiln/ir/op_schema.h"

namespace kiln::ir {

void registerShapeSchemas(OpRegistry& registry) { (void)registry; }

}  // namespace kiln::ir
