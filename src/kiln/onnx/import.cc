// ONNX import through protobuf (onnx.proto from Debian's ONNX library, compiled by kiln's build).
#include "kiln/onnx/import.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/text_format.h>

#include <climits>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "kiln/base/file.h"
#include "kiln/ir/op_schema.h"
#include "kiln/ir/shape_inference.h"
#include "kiln/reference/executor.h"
#include "onnx.pb.h"

namespace kiln::onnx {

namespace fs = std::filesystem;
using ir::DType;
using ir::Shape;
using ir::Tensor;

namespace {

bool parseProto(const std::string& bytes, google::protobuf::MessageLite& message) {
  if (bytes.size() > static_cast<size_t>(INT_MAX)) return false;
  google::protobuf::io::ArrayInputStream raw(bytes.data(), static_cast<int>(bytes.size()));
  google::protobuf::io::CodedInputStream coded(&raw);
  coded.SetTotalBytesLimit(INT_MAX);
  return message.ParseFromCodedStream(&coded) && coded.ConsumedEntireMessage();
}

// Protobuf reads one message of at most 2 GiB; larger models keep their weights in external data.
constexpr uintmax_t kMaxModelBytes = INT_MAX;

Status modelTooLarge(uintmax_t bytes) {
  return invalidInput(
      "the model file is {} bytes, over protobuf's limit of {} bytes for one ONNX message; save "
      "its weights as external data (onnx.save_model(..., save_as_external_data=True))",
      bytes, kMaxModelBytes);
}

// Resolves an external-data location, refusing anything that leaves the model's folder.
Result<fs::path> resolveExternalPath(const std::string& location, const fs::path& baseDir) {
  const fs::path relative(location);
  if (location.empty()) return invalidInput("external data location is empty");
  if (relative.is_absolute()) {
    return invalidInput(
        "external data location '{}' is an absolute path; it must be relative to "
        "the model's folder",
        location);
  }
  for (const auto& part : relative) {
    if (part == "..") {
      return invalidInput("external data location '{}' leaves the model's folder ('..')", location);
    }
  }
  std::error_code ec;
  const fs::path base = fs::weakly_canonical(baseDir.empty() ? fs::path(".") : baseDir, ec);
  const fs::path resolved = fs::weakly_canonical(base / relative, ec);
  if (ec) return ioError("cannot resolve external data location '{}': {}", location, ec.message());
  // Symlinks are resolved by weakly_canonical: the target itself must stay inside the folder.
  auto [baseEnd, resolvedIt] =
      std::mismatch(base.begin(), base.end(), resolved.begin(), resolved.end());
  if (baseEnd != base.end()) {
    return invalidInput(
        "external data location '{}' resolves to '{}', outside the model's "
        "folder '{}'",
        location, resolved.string(), base.string());
  }
  return resolved;
}

Result<std::string> readExternalData(const ::onnx::TensorProto& proto, const fs::path& baseDir,
                                     size_t expectedBytes) {
  std::string location;
  int64_t offset = 0;
  int64_t length = -1;
  for (const auto& entry : proto.external_data()) {
    if (entry.key() == "location") location = entry.value();
    try {
      if (entry.key() == "offset") offset = std::stoll(entry.value());
      if (entry.key() == "length") length = std::stoll(entry.value());
    } catch (const std::exception&) {
      return invalidInput("external data {} '{}' is not an integer", entry.key(), entry.value());
    }
  }
  KILN_ASSIGN_OR_RETURN(fs::path path, resolveExternalPath(location, baseDir));
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    return ioError("external data file '{}' does not exist", location);
  }
  const auto fileSize = static_cast<int64_t>(fs::file_size(path, ec));
  if (length < 0) length = static_cast<int64_t>(expectedBytes);
  if (offset < 0 || offset > fileSize || length > fileSize - offset) {
    return invalidInput(
        "external data range [offset {}, length {}] is out of bounds of '{}' ({} "
        "bytes)",
        offset, length, location, fileSize);
  }
  if (static_cast<size_t>(length) != expectedBytes) {
    return invalidInput("external data length {} does not match the declared shape ({} bytes)",
                        length, expectedBytes);
  }
  std::ifstream in(path, std::ios::binary);
  std::string bytes(static_cast<size_t>(length), '\0');
  in.seekg(offset);
  in.read(bytes.data(), length);
  if (!in) return ioError("cannot read {} bytes at offset {} of '{}'", length, offset, location);
  return bytes;
}

// Calls fn(field, "name") with the typed field (float_data, int32_data, ...) that holds this data
// type's values.
template <typename Fn>
auto withTypedField(const ::onnx::TensorProto& proto, Fn&& fn) {
  switch (proto.data_type()) {
    case ::onnx::TensorProto::FLOAT:
      return fn(proto.float_data(), "float_data");
    case ::onnx::TensorProto::DOUBLE:
      return fn(proto.double_data(), "double_data");
    case ::onnx::TensorProto::INT64:
      return fn(proto.int64_data(), "int64_data");
    case ::onnx::TensorProto::UINT64:
    case ::onnx::TensorProto::UINT32:
      return fn(proto.uint64_data(), "uint64_data");
    default:  // int32, int16, int8, uint16, uint8, bool, float16, bfloat16 live in int32_data
      return fn(proto.int32_data(), "int32_data");
  }
}

// The tensor's data, from raw_data, external data or its typed field, each checked against
// `shape` (of `count` elements, `byteSize` bytes) before the tensor is allocated: a 60-byte model
// that declares a terabyte of zeros is refused, not allocated.
Result<Tensor> readTensorData(const ::onnx::TensorProto& proto, const fs::path& baseDir,
                              const std::string& what, ir::DType dtype, Shape shape, int64_t count,
                              size_t byteSize) {
  const bool external = proto.data_location() == ::onnx::TensorProto::EXTERNAL;
  if (external || proto.has_raw_data()) {
    std::string externalBytes;
    if (external) {
      auto bytes = readExternalData(proto, baseDir, byteSize);
      if (!bytes.isOk()) return bytes.status().withContext(what);
      externalBytes = std::move(bytes).value();
    }
    const std::string& raw = external ? externalBytes : proto.raw_data();
    if (raw.size() != byteSize) {
      return invalidInput("{}: declared shape {} of {} needs {} bytes, but raw_data holds {}", what,
                          shape.toString(), ir::dtypeName(dtype), byteSize, raw.size());
    }
    KILN_ASSIGN_OR_RETURN(Tensor tensor, Tensor::allocate(dtype, std::move(shape)));
    if (!raw.empty()) std::memcpy(tensor.mutableRawData(), raw.data(), raw.size());
    return tensor;
  }
  return withTypedField(proto, [&](const auto& field, const char* name) -> Result<Tensor> {
    if (field.size() != count) {
      return invalidInput("{}: {} has {} elements, but the shape {} needs {}", what, name,
                          field.size(), shape.toString(), count);
    }
    KILN_ASSIGN_OR_RETURN(Tensor tensor, Tensor::allocate(dtype, std::move(shape)));
    ir::visitDType(dtype, [&](auto tag) {
      using T = decltype(tag);
      auto out = tensor.mutableData<T>();
      for (int i = 0; i < field.size(); ++i) {
        if constexpr (std::is_same_v<T, ir::Float16> || std::is_same_v<T, ir::BFloat16>) {
          out[i].bits = static_cast<uint16_t>(field.Get(i));  // stored as raw bits in int32_data
        } else {
          out[i] = static_cast<T>(field.Get(i));
        }
      }
    });
    return tensor;
  });
}

}  // namespace

// A tensor whose data are there but larger than the memory kiln may allocate (a limit on the
// process, or the machine) is an error naming it, not an abort.
Result<Tensor> tensorFromProto(const ::onnx::TensorProto& proto, const fs::path& baseDir) {
  const std::string what = proto.name().empty() ? "tensor" : "tensor '" + proto.name() + "'";
  auto dtype = ir::dtypeFromOnnxType(proto.data_type());
  if (!dtype.isOk()) return dtype.status().withContext(what);
  if (proto.has_segment()) return unsupported("{}: segmented tensors are not supported", what);
  Shape shape(std::vector<int64_t>(proto.dims().begin(), proto.dims().end()));
  auto counted = shape.checkedElementCount();
  if (!counted.isOk()) return counted.status().withContext(what);
  const size_t byteSize = static_cast<size_t>(*counted) * ir::dtypeSize(*dtype);
  try {
    return readTensorData(proto, baseDir, what, *dtype, std::move(shape), *counted, byteSize);
  } catch (const std::bad_alloc&) {
    return invalidInput("{}: its {} bytes do not fit in the memory this process may allocate", what,
                        byteSize);
  }
}

Result<std::pair<std::string, Tensor>> readTensorProtoFile(const fs::path& path) {
  KILN_ASSIGN_OR_RETURN(std::string bytes, readFileBytes(path));
  ::onnx::TensorProto proto;
  if (!parseProto(bytes, proto)) {
    return invalidInput("'{}' is not a serialized ONNX TensorProto", path.string());
  }
  auto tensor = tensorFromProto(proto, path.parent_path());
  if (!tensor.isOk()) return tensor.status().withContext(path.string());
  return std::make_pair(proto.name(), std::move(tensor).value());
}

Result<std::map<std::string, std::vector<int64_t>>> parseShapeSpec(const std::string& spec) {
  std::map<std::string, std::vector<int64_t>> shapes;
  std::stringstream entries(spec);
  std::string entry;
  while (std::getline(entries, entry, ',')) {
    const auto colon = entry.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      return invalidInput("--shapes entry '{}' must be name:DxDx... (e.g. input:1x3x224x224)",
                          entry);
    }
    const std::string name = entry.substr(0, colon);
    std::vector<int64_t> dims;
    std::stringstream dimsText(entry.substr(colon + 1));
    std::string dim;
    while (std::getline(dimsText, dim, 'x')) {
      char* end = nullptr;
      errno = 0;
      const long long value = std::strtoll(dim.c_str(), &end, 10);
      if (dim.empty() || *end != '\0' || errno == ERANGE || value < 0) {
        return invalidInput("--shapes entry '{}': '{}' is not a non-negative dimension", entry,
                            dim);
      }
      dims.push_back(value);
    }
    if (shapes.count(name)) return invalidInput("--shapes gives input '{}' twice", name);
    shapes[name] = std::move(dims);
  }
  return shapes;
}

namespace {

class GraphImporter {
 public:
  GraphImporter(const ::onnx::ModelProto& model, const fs::path& baseDir,
                const ImportOptions& options)
      : model_(model), baseDir_(baseDir), options_(options) {}

  Result<Model> run() {
    Model result;
    KILN_RETURN_IF_ERROR(readModelInfo(result.info));
    ir::Graph& graph = result.graph;
    const ::onnx::GraphProto& proto = model_.graph();
    graph.name = proto.name();
    graph.opsetImports.insert(result.info.opsetImports.begin(), result.info.opsetImports.end());
    KILN_RETURN_IF_ERROR(importInitializers(proto, graph));
    KILN_RETURN_IF_ERROR(importInputs(proto, graph));
    KILN_RETURN_IF_ERROR(importNodes(proto, result.info, graph));
    KILN_RETURN_IF_ERROR(importOutputs(proto, graph));
    if (options_.inferShapes) {
      KILN_RETURN_IF_ERROR(ir::inferShapes(graph, reference::constantEvaluator()));
      KILN_RETURN_IF_ERROR(checkDeclaredOutputs(proto, graph));
    }
    return result;
  }

 private:
  Status readModelInfo(ModelInfo& info) {
    info.irVersion = model_.ir_version();
    info.producerName = model_.producer_name();
    info.producerVersion = model_.producer_version();
    if (!model_.has_graph()) return invalidInput("the model has no graph");
    if (info.irVersion < kMinIrVersion || info.irVersion > kMaxIrVersion) {
      return unsupported("IR version {} is outside the range kiln supports ({} to {})",
                         info.irVersion, kMinIrVersion, kMaxIrVersion);
    }
    if (model_.opset_import_size() == 0) {
      return invalidInput(
          "the model imports no opset (opset_import is empty); the file may be "
          "truncated");
    }
    for (const auto& opset : model_.opset_import()) {
      const std::string domain = opset.domain() == "ai.onnx" ? "" : opset.domain();
      info.opsetImports[domain] = opset.version();
    }
    // A model that uses only other domains need not import the default one; a node of a domain
    // the model does not import is refused where it is imported.
    auto it = info.opsetImports.find("");
    if (it != info.opsetImports.end() && (it->second < kMinOpset || it->second > kMaxOpset)) {
      return unsupported("default-domain opset {} is outside the range kiln supports ({} to {})",
                         it->second, kMinOpset, kMaxOpset);
    }
    return Status::ok();
  }

  Status importInitializers(const ::onnx::GraphProto& proto, ir::Graph& graph) {
    for (const auto& initializer : proto.initializer()) {
      if (graph.findValue(initializer.name())) {
        return invalidInput("initializer '{}' is defined twice", initializer.name());
      }
      KILN_ASSIGN_OR_RETURN(Tensor tensor, tensorFromProto(initializer, baseDir_));
      ir::Value* value = graph.addValue(initializer.name());
      value->dtype = tensor.dtype();
      value->shape = tensor.shape();
      value->hasType = true;
      value->isInitializer = true;
      value->constant = std::move(tensor);
    }
    if (proto.sparse_initializer_size() > 0) {
      return unsupported("sparse initializers are not supported");
    }
    return Status::ok();
  }

  Result<Shape> inputShape(const ::onnx::ValueInfoProto& info) {
    const auto& tensorType = info.type().tensor_type();
    const auto given = options_.inputShapes.find(info.name());
    std::vector<int64_t> dims;
    const bool hasShape = tensorType.has_shape();
    const int rank = tensorType.shape().dim_size();
    if (given != options_.inputShapes.end()) {
      dims = given->second;
      if (hasShape && static_cast<int>(dims.size()) != rank) {
        return invalidInput("--shapes gives input '{}' rank {}, but the model declares rank {}",
                            info.name(), dims.size(), rank);
      }
      for (int i = 0; hasShape && i < rank; ++i) {
        const auto& dim = tensorType.shape().dim(i);
        if (dim.has_dim_value() && dim.dim_value() > 0 && dim.dim_value() != dims[i]) {
          return invalidInput(
              "--shapes gives input '{}' dimension {} = {}, but the model fixes "
              "it to {}",
              info.name(), i, dims[i], dim.dim_value());
        }
      }
    } else {
      if (!options_.inferShapes) {
        // Describing the model as written: dynamic dimensions stay unknown (-1, printed '?').
        for (int i = 0; i < rank; ++i) {
          const auto& dim = tensorType.shape().dim(i);
          dims.push_back(dim.has_dim_value() && !dim.has_dim_param() ? dim.dim_value() : -1);
        }
        return Shape(std::move(dims));
      }
      if (!hasShape) {
        return invalidInput("input '{}' has no declared shape; give one with --shapes {}:DxD...",
                            info.name(), info.name());
      }
      for (int i = 0; i < rank; ++i) {
        const auto& dim = tensorType.shape().dim(i);
        if (!dim.has_dim_value() || dim.dim_value() < 0 ||
            (dim.dim_value() == 0 && dim.has_dim_param())) {
          const std::string param =
              dim.has_dim_param() ? fmt::format(" ('{}')", dim.dim_param()) : "";
          return invalidInput(
              "input '{}' dimension {}{} is dynamic; fix it with --shapes "
              "{}:DxD...",
              info.name(), i, param, info.name());
        }
        dims.push_back(dim.dim_value());
      }
    }
    Shape shape(std::move(dims));
    auto count = shape.checkedElementCount();
    if (!count.isOk()) return count.status().withContext("input '" + info.name() + "'");
    return shape;
  }

  Status importInputs(const ::onnx::GraphProto& proto, ir::Graph& graph) {
    // A misspelt --shapes name is the likelier mistake than the dynamic dimension it left
    // unfixed, so it is reported first.
    std::set<std::string> declared;
    for (const auto& info : proto.input()) declared.insert(info.name());
    for (const auto& [name, dims] : options_.inputShapes) {
      if (!declared.count(name)) {
        return invalidInput("--shapes names '{}', which is not an input of the model", name);
      }
    }
    for (const auto& info : proto.input()) {
      if (ir::Value* initializer = graph.findValue(info.name())) {
        (void)initializer;  // an input with an initializer is a constant with a default
        continue;
      }
      if (!info.type().has_tensor_type()) {
        return unsupported(
            "input '{}' is not a tensor (sequences, maps and optionals are not "
            "supported)",
            info.name());
      }
      ir::Value* value = graph.addValue(info.name());
      auto dtype = ir::dtypeFromOnnxType(info.type().tensor_type().elem_type());
      if (!dtype.isOk()) return dtype.status().withContext("input '" + info.name() + "'");
      value->dtype = *dtype;
      auto constant = options_.constantInputs.find(info.name());
      if (constant != options_.constantInputs.end()) {
        value->shape = constant->second.shape();
        value->constant = constant->second.castTo(value->dtype);
      } else {
        KILN_ASSIGN_OR_RETURN(value->shape, inputShape(info));
        graph.inputs.push_back(value);
      }
      value->hasType = true;
    }
    return Status::ok();
  }

  Result<ir::Attribute> importAttribute(const ::onnx::AttributeProto& attr) {
    using A = ::onnx::AttributeProto;
    ir::Attribute result;
    switch (attr.type()) {
      case A::INT:
        result.value = attr.i();
        break;
      case A::FLOAT:
        result.value = attr.f();
        break;
      case A::STRING:
        result.value = attr.s();
        break;
      case A::INTS:
        result.value = std::vector<int64_t>(attr.ints().begin(), attr.ints().end());
        break;
      case A::FLOATS:
        result.value = std::vector<float>(attr.floats().begin(), attr.floats().end());
        break;
      case A::STRINGS:
        result.value = std::vector<std::string>(attr.strings().begin(), attr.strings().end());
        break;
      case A::TENSOR: {
        KILN_ASSIGN_OR_RETURN(Tensor tensor, tensorFromProto(attr.t(), baseDir_));
        result.value = std::move(tensor);
        break;
      }
      case A::GRAPH:
      case A::GRAPHS:
        return unsupported("attribute '{}' holds a subgraph; control flow is not supported yet",
                           attr.name());
      case A::SPARSE_TENSOR:
      case A::SPARSE_TENSORS:
        return unsupported("attribute '{}' holds a sparse tensor, which is not supported",
                           attr.name());
      default:
        return invalidInput("attribute '{}' has unknown or unsupported type {}", attr.name(),
                            static_cast<int>(attr.type()));
    }
    return result;
  }

  Status importNodes(const ::onnx::GraphProto& proto, const ModelInfo& info, ir::Graph& graph) {
    std::set<std::string> nodeNames;
    for (int index = 0; index < proto.node_size(); ++index) {
      const auto& nodeProto = proto.node(index);
      ir::Node* node = graph.addNode(nodeProto.op_type());
      node->domain = nodeProto.domain() == "ai.onnx" ? "" : nodeProto.domain();
      if (node->domain == ir::kKilnDomain) {
        return unsupported(
            "node '{}' ({}) uses domain '{}', which is reserved for ops kiln "
            "creates itself",
            nodeProto.name(), nodeProto.op_type(), node->domain);
      }
      std::string name = nodeProto.name();
      if (name.empty() || nodeNames.count(name)) {
        name = fmt::format("{}{}_{}", name.empty() ? "" : name + "_", nodeProto.op_type(), index);
      }
      nodeNames.insert(name);
      node->name = name;
      auto opset = info.opsetImports.find(node->domain);
      if (opset == info.opsetImports.end()) {
        return invalidInput("node '{}' ({}) uses domain '{}', which the model does not import",
                            node->name, node->opType, node->domain);
      }
      node->opsetVersion = static_cast<int>(opset->second);
      for (const auto& inputName : nodeProto.input()) {
        if (inputName.empty()) {
          node->inputs.push_back(nullptr);
          continue;
        }
        ir::Value* value = graph.findValue(inputName);
        if (!value || (!value->hasType && !value->producer)) {
          return invalidInput(
              "{}: input '{}' is neither a graph input, an initializer nor the "
              "output of an earlier node",
              node->describe(), inputName);
        }
        node->inputs.push_back(value);
      }
      for (const auto& outputName : nodeProto.output()) {
        if (outputName.empty()) {
          node->outputs.push_back(nullptr);
          continue;
        }
        if (graph.findValue(outputName)) {
          return invalidInput("{}: output '{}' is already defined elsewhere in the graph",
                              node->describe(), outputName);
        }
        ir::Value* value = graph.addValue(outputName);
        value->producer = node;
        node->outputs.push_back(value);
      }
      for (const auto& attr : nodeProto.attribute()) {
        auto converted = importAttribute(attr);
        if (!converted.isOk()) return converted.status().withContext(node->describe());
        node->attributes[attr.name()] = std::move(converted).value();
      }
    }
    return Status::ok();
  }

  Status importOutputs(const ::onnx::GraphProto& proto, ir::Graph& graph) {
    for (const auto& info : proto.output()) {
      ir::Value* value = graph.findValue(info.name());
      if (!value) {
        return invalidInput("graph output '{}' is not produced by any node", info.name());
      }
      graph.outputs.push_back(value);
    }
    if (graph.outputs.empty()) return invalidInput("the graph has no outputs");
    return Status::ok();
  }

  // A declared output type that disagrees with inference means a malformed model or a kiln bug;
  // either way the user must hear of it.
  Status checkDeclaredOutputs(const ::onnx::GraphProto& proto, const ir::Graph& graph) {
    for (int i = 0; i < proto.output_size(); ++i) {
      const auto& info = proto.output(i);
      const ir::Value* value = graph.outputs[i];
      if (!info.type().has_tensor_type()) continue;
      const auto& tensorType = info.type().tensor_type();
      if (tensorType.elem_type() != 0) {
        auto declared = ir::dtypeFromOnnxType(tensorType.elem_type());
        if (declared.isOk() && *declared != value->dtype) {
          return invalidInput("graph output '{}' is declared {}, but computes {}", info.name(),
                              ir::dtypeName(*declared), ir::dtypeName(value->dtype));
        }
      }
      if (!tensorType.has_shape()) continue;
      const auto& shape = tensorType.shape();
      bool mismatch = shape.dim_size() != static_cast<int>(value->shape.rank());
      for (int d = 0; !mismatch && d < shape.dim_size(); ++d) {
        if (shape.dim(d).has_dim_value() && shape.dim(d).dim_value() > 0) {
          mismatch = shape.dim(d).dim_value() != value->shape[d];
        }
      }
      if (mismatch) {
        std::vector<std::string> dims;
        for (const auto& dim : shape.dim()) {
          dims.push_back(dim.has_dim_value() ? std::to_string(dim.dim_value()) : dim.dim_param());
        }
        return invalidInput("graph output '{}' is declared with shape [{}], but computes {}",
                            info.name(), fmt::join(dims, ","), value->shape.toString());
      }
    }
    return Status::ok();
  }

  const ::onnx::ModelProto& model_;
  fs::path baseDir_;
  const ImportOptions& options_;
};

}  // namespace

Result<Model> importModelFromBytes(const std::string& bytes, const fs::path& baseDir,
                                   const ImportOptions& options) {
  ::onnx::ModelProto model;
  if (bytes.empty()) return invalidInput("the file is empty, not an ONNX model");
  if (bytes.size() > kMaxModelBytes) return modelTooLarge(bytes.size());
  if (!parseProto(bytes, model)) {
    return invalidInput(
        "not a valid ONNX model: the protobuf could not be parsed (the file is "
        "truncated, corrupt, nested more than 100 messages deep, or not ONNX)");
  }
  if (!model.has_graph() && model.opset_import_size() == 0) {
    return invalidInput("not an ONNX model: it has neither a graph nor an opset import");
  }
  return GraphImporter(model, baseDir, options).run();
}

Result<Model> importModelFromText(const std::string& text, const ImportOptions& options) {
  ::onnx::ModelProto model;
  if (!google::protobuf::TextFormat::ParseFromString(text, &model)) {
    return invalidInput("not a valid ONNX model in protobuf text format");
  }
  return GraphImporter(model, fs::path("."), options).run();
}

Result<Model> importModel(const fs::path& path, const ImportOptions& options) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (!ec && size > kMaxModelBytes) return modelTooLarge(size).withContext(path.string());
  KILN_ASSIGN_OR_RETURN(std::string bytes, readFileBytes(path));
  auto model = importModelFromBytes(bytes, path.parent_path(), options);
  if (!model.isOk()) return model.status().withContext(path.string());
  return model;
}

}  // namespace kiln::onnx
