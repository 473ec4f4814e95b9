// Model inputs and reference outputs as users give them: trtexec-style file specs
// ("name:file.npy,name2:file.npz" or bare .npz files whose arrays are named after the tensors),
// and seeded random tensors for inputs that are not given.
#pragma once

#include <map>
#include <random>
#include <string>
#include <vector>

#include "kiln/base/status.h"
#include "kiln/ir/tensor.h"

namespace kiln::ir {

// Reads every spec (each "name:file.npy", "name:file.npz" or "file.npz", comma-separated) into
// tensors by name. `flag` names the option in errors ("--loadInputs"). A name given twice, or
// an .npy without a name, is an error.
Result<std::map<std::string, Tensor>> loadNamedTensors(const std::vector<std::string>& specs,
                                                       const std::string& flag);

// The files a spec names, in order (for hashing what a run read).
std::vector<std::string> filesOfSpec(const std::string& spec);

// Floats uniform in [-1, 1]; integers uniform in [0, 7] (valid as indices, token ids and masks in
// most models); booleans 0 or 1.
Tensor seededRandomTensor(DType dtype, const Shape& shape, std::mt19937_64& rng);

}  // namespace kiln::ir
