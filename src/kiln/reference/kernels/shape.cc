// Reference kernels for the shape and data-layout ops.
#include <cstring>

#include "kiln/reference/kernel.h"

namespace kiln::reference {

namespace {

Status runConstant(KernelContext& ctx) {
  const ir::Node& node = ctx.node();
  const auto& [name, attribute] = *node.attributes.begin();
  Tensor& out = ctx.output(0);
  if (name == "value") {
    const Tensor& value = std::get<Tensor>(attribute.value);
    std::memcpy(out.mutableRawData(), value.rawData(), value.byteSize());
  } else if (name == "value_float") {
    out.mutableData<float>()[0] = std::get<float>(attribute.value);
  } else if (name == "value_int") {
    out.mutableData<int64_t>()[0] = std::get<int64_t>(attribute.value);
  } else if (name == "value_floats") {
    const auto& v = std::get<std::vector<float>>(attribute.value);
    std::copy(v.begin(), v.end(), out.mutableData<float>().begin());
  } else if (name == "value_ints") {
    const auto& v = std::get<std::vector<int64_t>>(attribute.value);
    std::copy(v.begin(), v.end(), out.mutableData<int64_t>().begin());
  } else {
    return ctx.unsupportedHere("attribute '{}' is not supported", name);
  }
  return Status::ok();
}

}  // namespace

void registerShapeKernels(KernelRegistry& registry) { registry.add("Constant", runConstant); }

}  // namespace kiln::reference
