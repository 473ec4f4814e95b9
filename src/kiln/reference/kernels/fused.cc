// Reference kernels for kiln's own ops (domain "kiln"), the ones fusion passes create.
#include "kiln/reference/kernel.h"

namespace kiln::reference {

void registerFusedKernels(KernelRegistry& registry) { (void)registry; }

}  // namespace kiln::reference
