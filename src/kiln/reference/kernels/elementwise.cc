// Reference kernels for the elementwise ops.
#include "kiln/reference/kernel.h"

namespace kiln::reference {

void registerElementwiseKernels(KernelRegistry& registry) { (void)registry; }

}  // namespace kiln::reference
