// Shape inference for the elementwise ops.
#include "kiln/ir/op_schema.h"

namespace kiln::ir {

void registerElementwiseSchemas(OpRegistry& registry) { (void)registry; }

}  // namespace kiln::ir
