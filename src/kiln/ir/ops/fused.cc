// Shape inference for kiln's own ops (domain "kiln"), the ones fusion passes create.
#include "kiln/ir/op_schema.h"

namespace kiln::ir {

void registerFusedSchemas(OpRegistry& registry) { (void)registry; }

}  // namespace kiln::ir
