// libFuzzer harness: the graph passes against the reference executor. The bytes drive a small
// generator of valid graphs over the data movements and simple arithmetic the passes rewrite
// (Transpose, Reshape, Gather, Slice, Concat, Neg, Relu, Abs, Add, of one to four axes of up to
// four elements), written as ONNX text and imported (shape inference decides what is valid).
// The whole pass pipeline then runs on a copy (for the CPU or the CUDA backend, with the default
// route or one with a pass turned off), and the reference executor
// runs both graphs on the same seeded inputs: a pipeline error on a graph that imported, or an
// output that differs, aborts (libFuzzer keeps the input). The ops chosen move and negate
// values exactly, so the outputs must be equal, not close.
#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kiln/ir/printer.h"
#include "kiln/onnx/import.h"
#include "kiln/passes/pipeline.h"
#include "kiln/reference/executor.h"

namespace {

class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return at_ >= size_; }
  // The next byte (0 once they run out), as a value in [0, n).
  int64_t below(int64_t n) { return n <= 0 ? 0 : (at_ < size_ ? data_[at_++] : 0) % n; }
  // A value in [lo, hi].
  int64_t in(int64_t lo, int64_t hi) { return lo + below(hi - lo + 1); }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

using Dims = std::vector<int64_t>;

int64_t count(const Dims& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

std::string ints(const std::vector<int64_t>& values) {
  std::string text;
  for (int64_t v : values) text += fmt::format(" int64_data: {}", v);
  return text;
}

// The graph being written: values with their dims, nodes and int64 initializers as text.
struct Writer {
  std::vector<Dims> values;  // value i is "v<i>"
  std::string nodes, initializers;
  int constants = 0;

  std::string constant(const std::vector<int64_t>& data) {
    const std::string name = fmt::format("c{}", constants++);
    initializers += fmt::format("  initializer {{ name: \"{}\" data_type: 7 dims: {}{} }}\n", name,
                                data.size(), ints(data));
    return name;
  }
  // A node of `op` reading `inputs` (names), writing a new value of `dims`; returns its index.
  size_t node(const std::string& op, const std::vector<std::string>& inputs, const Dims& dims,
              const std::string& attributes = "") {
    const size_t out = values.size();
    std::string text = fmt::format("  node {{ name: \"n{}\" op_type: \"{}\"", out, op);
    for (const std::string& input : inputs) text += fmt::format(" input: \"{}\"", input);
    text += fmt::format(" output: \"v{}\"{} }}\n", out, attributes);
    nodes += text;
    values.push_back(dims);
    return out;
  }
};

std::string value(size_t i) { return fmt::format("v{}", i); }

// ONNX Slice's element count along one axis of `dim` (the reference's rules, written again here
// only to keep the generated shapes valid; the reference executor checks the result).
int64_t sliceCount(int64_t dim, int64_t start, int64_t end, int64_t step) {
  if (start < 0) start += dim;
  if (end < 0) end += dim;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, dim);
    end = std::clamp<int64_t>(end, 0, dim);
    return end > start ? (end - start + step - 1) / step : 0;
  }
  start = std::clamp<int64_t>(start, 0, dim - 1);
  end = std::clamp<int64_t>(end, -1, dim - 1);
  return start > end ? (start - end - step - 1) / -step : 0;
}

std::string generate(Bytes& in) {
  Writer w;
  Dims x;
  const int64_t rank = in.in(1, 4);
  for (int64_t a = 0; a < rank; ++a) x.push_back(in.in(1, 4));
  w.values.push_back(x);
  const int64_t steps = in.in(1, 10);
  for (int64_t s = 0; s < steps && !in.done(); ++s) {
    const size_t from = static_cast<size_t>(in.below(static_cast<int64_t>(w.values.size())));
    const Dims dims = w.values[from];
    const auto r = static_cast<int64_t>(dims.size());
    switch (in.below(9)) {
      case 0: {  // Transpose
        std::vector<int64_t> perm(dims.size());
        for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
        for (size_t i = perm.size(); i > 1; --i) {
          std::swap(perm[i - 1], perm[static_cast<size_t>(in.below(static_cast<int64_t>(i)))]);
        }
        Dims out;
        std::string attribute = " attribute { name: \"perm\" type: INTS";
        for (int64_t p : perm) {
          out.push_back(dims[static_cast<size_t>(p)]);
          attribute += fmt::format(" ints: {}", p);
        }
        w.node("Transpose", {value(from)}, out, attribute + " }");
        break;
      }
      case 1: {  // Reshape: merge two neighbouring axes, or put in or take out an axis of 1
        Dims out = dims;
        const int64_t mode = in.below(3);
        if (mode == 0 && r >= 2) {
          const auto a = static_cast<size_t>(in.below(r - 1));
          out[a] *= out[a + 1];
          out.erase(out.begin() + static_cast<std::ptrdiff_t>(a) + 1);
        } else if (mode == 1 && r < 4) {
          out.insert(out.begin() + in.below(r + 1), 1);
        } else {
          const auto one = std::find(out.begin(), out.end(), 1);
          if (one == out.end() || r == 1) continue;
          out.erase(one);
        }
        w.node("Reshape", {value(from), w.constant(out)}, out);
        break;
      }
      case 2: {  // Gather of constant indices, negative ones too
        const int64_t axis = in.below(r);
        const int64_t dim = dims[static_cast<size_t>(axis)];
        std::vector<int64_t> indices(static_cast<size_t>(in.in(1, 4)));
        for (int64_t& i : indices) i = in.in(-dim, dim - 1);
        Dims out = dims;
        out[static_cast<size_t>(axis)] = static_cast<int64_t>(indices.size());
        w.node("Gather", {value(from), w.constant(indices)}, out,
               fmt::format(" attribute {{ name: \"axis\" type: INT i: {} }}",
                           axis - (in.below(2) ? r : 0)));
        break;
      }
      case 3: {  // Slice along one axis
        const int64_t axis = in.below(r);
        const int64_t dim = dims[static_cast<size_t>(axis)];
        const int64_t steps_[] = {1, 2, 3, -1, -2};
        const int64_t step = steps_[in.below(5)];
        const int64_t start = in.in(-dim - 1, dim + 1);
        const int64_t endChoice = in.below(4);
        const int64_t end = endChoice == 0   ? std::numeric_limits<int64_t>::max()
                            : endChoice == 1 ? std::numeric_limits<int64_t>::min()
                                             : in.in(-dim - 1, dim + 1);
        const int64_t n = sliceCount(dim, start, end, step);
        if (n == 0) continue;
        Dims out = dims;
        out[static_cast<size_t>(axis)] = n;
        w.node("Slice",
               {value(from), w.constant({start}), w.constant({end}),
                w.constant({axis - (in.below(2) ? r : 0)}), w.constant({step})},
               out);
        break;
      }
      case 4: {  // Concat with a value of the same dims (itself, often)
        std::vector<size_t> same;
        for (size_t i = 0; i < w.values.size(); ++i) {
          if (w.values[i] == dims) same.push_back(i);
        }
        const size_t other = same[static_cast<size_t>(in.below(static_cast<int64_t>(same.size())))];
        const int64_t axis = in.below(r);
        Dims out = dims;
        out[static_cast<size_t>(axis)] *= 2;
        if (count(out) > 4096) continue;
        w.node("Concat", {value(from), value(other)}, out,
               fmt::format(" attribute {{ name: \"axis\" type: INT i: {} }}",
                           axis - (in.below(2) ? r : 0)));
        break;
      }
      case 5:
        w.node("Neg", {value(from)}, dims);
        break;
      case 6:
        w.node("Relu", {value(from)}, dims);
        break;
      case 7:
        w.node("Abs", {value(from)}, dims);
        break;
      default: {  // Add with a value of the same dims
        std::vector<size_t> same;
        for (size_t i = 0; i < w.values.size(); ++i) {
          if (w.values[i] == dims) same.push_back(i);
        }
        const size_t other = same[static_cast<size_t>(in.below(static_cast<int64_t>(same.size())))];
        w.node("Add", {value(from), value(other)}, dims);
        break;
      }
    }
  }
  if (w.values.size() < 2) return "";
  std::string text = "ir_version: 8\nopset_import { version: 18 }\ngraph {\n" + w.nodes +
                     w.initializers +
                     "  input { name: \"v0\" type { tensor_type { elem_type: 1 shape {";
  for (int64_t d : x) text += fmt::format(" dim {{ dim_value: {} }}", d);
  text += " } } } }\n";
  // The last value, and perhaps another one (a value with readers inside the graph too).
  const size_t last = w.values.size() - 1;
  text += fmt::format("  output {{ name: \"{}\" type {{ tensor_type {{ elem_type: 1 }} }} }}\n",
                      value(last));
  const auto second = static_cast<size_t>(in.in(1, static_cast<int64_t>(last)));
  if (second != last && in.below(2)) {
    text += fmt::format("  output {{ name: \"{}\" type {{ tensor_type {{ elem_type: 1 }} }} }}\n",
                        value(second));
  }
  return text + "}\n";
}

[[noreturn]] void fail(const std::string& text, const std::string& what) {
  std::fprintf(stderr, "passes_fuzz: %s\nmodel:\n%s\n", what.c_str(), text.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes bytes(data, size);
  const std::string text = generate(bytes);
  if (text.empty()) return 0;
  auto original = kiln::onnx::importModelFromText(text);
  if (!original.isOk()) return 0;  // shape inference refused it: not a graph to compare
  auto transformed = kiln::onnx::importModelFromText(text);
  if (!transformed.isOk()) fail(text, "the second import failed");
  // The route and the backend the pipeline builds for, from the bytes left: the passes with one
  // of their neighbours off meet graphs they otherwise never see.
  static const char* const kRoutes[] = {"",
                                        "-graph.compose_row_moves=off",
                                        "-graph.compose_row_moves.concats=off",
                                        "-graph.concat_slices_to_gather=off",
                                        "-graph.simplify_transpose_reshape=off",
                                        "-graph.eliminate_noops=off",
                                        "-fusion.eltwise_chain=off"};
  const char* routeText = kRoutes[bytes.below(std::size(kRoutes))];
  auto route = kiln::knobs::Route::parse(routeText);
  if (!route.isOk()) fail(text, std::string("the route does not parse: ") + routeText);
  kiln::passes::PipelineOptions options;
  options.backend = bytes.below(2) ? "cuda" : "cpu";
  auto records = kiln::passes::runPipeline(transformed->graph, *route, options);
  if (!records.isOk()) {
    fail(text, fmt::format("the pipeline failed ({}, route '{}'): {}", options.backend, routeText,
                           records.status().message()));
  }

  std::vector<kiln::ir::Tensor> inputs;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (const kiln::ir::Value* input : original->graph.inputs) {
    kiln::ir::Tensor t(kiln::ir::DType::kFloat32, input->shape);
    for (float& v : t.mutableData<float>()) v = uniform(rng);
    inputs.push_back(std::move(t));
  }
  auto before = kiln::reference::ReferenceExecutor::create(original->graph);
  if (!before.isOk()) return 0;
  auto expected = before->run(inputs);
  if (!expected.isOk()) return 0;  // e.g. an index the reference refuses at run time
  auto after = kiln::reference::ReferenceExecutor::create(transformed->graph);
  if (!after.isOk())
    fail(text, "the transformed graph has no reference: " + after.status().message());
  auto actual = after->run(inputs);
  if (!actual.isOk())
    fail(text, "the transformed graph does not run: " + actual.status().message());
  if (actual->size() != expected->size()) fail(text, "a different number of outputs");
  for (size_t o = 0; o < expected->size(); ++o) {
    const kiln::ir::Tensor& e = (*expected)[o];
    const kiln::ir::Tensor& a = (*actual)[o];
    if (e.shape() != a.shape()) {
      fail(text, fmt::format("output {}: shape {} after the passes, {} before", o,
                             a.shape().toString(), e.shape().toString()));
    }
    for (int64_t i = 0; i < e.elementCount(); ++i) {
      if (e.elementAsDouble(i) != a.elementAsDouble(i)) {
        fail(text, fmt::format("output {} element {}: {} after the passes ({}, route '{}'), {} "
                               "before\nafter:\n{}",
                               o, i, a.elementAsDouble(i), options.backend, routeText,
                               e.elementAsDouble(i), kiln::ir::printGraph(transformed->graph)));
      }
    }
  }
  return 0;
}
