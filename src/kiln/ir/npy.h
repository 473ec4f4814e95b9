// numpy's own tensor files: .npy (one array) and .npz (a zip of .npy files, stored or
// deflate-compressed), for model inputs, reference outputs and saved outputs.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/base/status.h"
#include "kiln/ir/tensor.h"

namespace kiln::ir {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Parses .npy bytes; `what` names the source in errors. Fortran-ordered and big-endian arrays
// are converted to kiln's row-major little-endian layout.
Result<Tensor> parseNpy(std::string_view bytes, const std::string& what);
// Serializes as .npy format 1.0 (2.0 when the header needs it). bfloat16 has no numpy dtype
// and is refused.
Result<std::string> serializeNpy(const Tensor& tensor);

Result<Tensor> readNpy(const std::filesystem::path& path);
Status writeNpy(const std::filesystem::path& path, const Tensor& tensor);

// Reads every array of an .npz, in archive order, named without the ".npy" suffix.
Result<NamedTensors> readNpz(const std::filesystem::path& path);
Status writeNpz(const std::filesystem::path& path, const NamedTensors& tensors,
                bool compressed = false);

// Reads .npy (one tensor, named by `defaultName`) or .npz by the file's extension.
Result<NamedTensors> readTensorFile(const std::filesystem::path& path,
                                    const std::string& defaultName);

}  // namespace kiln::ir
