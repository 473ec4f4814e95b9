// Shape inference for the neural ops.
#include "kiln/ir/op_schema.h"

namespace kiln::ir {

void registerNeuralSchemas(OpRegistry& registry) { (void)registry; }

}  // namespace kiln::ir
