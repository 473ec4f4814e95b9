// Reference kernels for the shape ops.
#include "kiln/reference/kernel.h"

namespace kiln::reference {

void registerShapeKernels(KernelRegistry& registry) { (void)registry; }

}  // namespace kiln::reference
