// Shape inference for the indexing ops.
#include "kiln/ir/op_schema.h"

namespace kiln::ir {

void registerIndexingSchemas(OpRegistry& registry) { (void)registry; }

}  // namespace kiln::ir
