// Reference kernels for the indexing ops.
#include "kiln/reference/kernel.h"

namespace kiln::reference {

void registerIndexingKernels(KernelRegistry& registry) { (void)registry; }

}  // namespace kiln::reference
