// Reference kernels for the neural ops.
#include "kiln/reference/kernel.h"

namespace kiln::reference {

void registerNeuralKernels(KernelRegistry& registry) { (void)registry; }

}  // namespace kiln::reference
