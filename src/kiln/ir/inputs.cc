// Input and reference tensors from files, and seeded random inputs.
#include "kiln/ir/inputs.h"

#include <sstream>

#include "kiln/ir/npy.h"

namespace kiln::ir {

namespace {

std::vector<std::pair<std::string, std::string>> entriesOf(const std::string& spec) {
  std::vector<std::pair<std::string, std::string>> entries;
  std::stringstream stream(spec);
  std::string entry;
  while (std::getline(stream, entry, ',')) {
    if (entry.empty()) continue;
    const auto colon = entry.find(':');
    if (colon == std::string::npos) {
      entries.emplace_back("", entry);
    } else {
      entries.emplace_back(entry.substr(0, colon), entry.substr(colon + 1));
    }
  }
  return entries;
}

}  // namespace

std::vector<std::string> filesOfSpec(const std::string& spec) {
  std::vector<std::string> files;
  for (const auto& [name, file] : entriesOf(spec)) files.push_back(file);
  return files;
}

Result<std::map<std::string, Tensor>> loadNamedTensors(const std::vector<std::string>& specs,
                                                       const std::string& flag) {
  std::map<std::string, Tensor> tensors;
  for (const auto& spec : specs) {
    for (const auto& [name, file] : entriesOf(spec)) {
      if (name.empty() && file.size() > 4 && file.substr(file.size() - 4) == ".npy") {
        return invalidInput("{} '{}': an .npy file needs the tensor's name (name:{})", flag, file,
                            file);
      }
      KILN_ASSIGN_OR_RETURN(NamedTensors read, readTensorFile(file, name));
      for (auto& [tensorName, tensor] : read) {
        // name:file.npz with one array binds that array to `name`.
        const std::string key = !name.empty() && read.size() == 1 ? name : tensorName;
        if (tensors.count(key)) return invalidInput("{} gives '{}' twice", flag, key);
        tensors[key] = std::move(tensor);
      }
    }
  }
  return tensors;
}

Tensor seededRandomTensor(DType dtype, const Shape& shape, std::mt19937_64& rng) {
  Tensor floats(DType::kFloat32, shape);
  if (isFloating(dtype)) {
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (float& v : floats.mutableData<float>()) v = uniform(rng);
  } else {
    std::uniform_int_distribution<int> uniform(0, dtype == DType::kBool ? 1 : 7);
    for (float& v : floats.mutableData<float>()) v = static_cast<float>(uniform(rng));
  }
  return floats.castTo(dtype);
}

}  // namespace kiln::ir
