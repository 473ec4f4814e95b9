// Buffer families, lifetimes and the arena planner shared by the backends.
#include "kiln/backends/buffer_assignment.h"

#include <algorithm>
#include <limits>
#include <numeric>

namespace kiln::backends {

MemoryPlan planMemory(const std::vector<Lifetime>& lifetimes, bool reuse, int64_t alignment,
                      Fit fit, Order order) {
  auto alignUp = [alignment](int64_t bytes) {
    return (bytes + alignment - 1) / alignment * alignment;
  };
  MemoryPlan plan;
  plan.offsets.assign(lifetimes.size(), 0);
  if (!reuse) {
    for (size_t i = 0; i < lifetimes.size(); ++i) {
      plan.offsets[i] = plan.arenaBytes;
      plan.arenaBytes += alignUp(lifetimes[i].bytes);
    }
    return plan;
  }
  // Largest first, or in order of definition (ties keep the lifetimes' order).
  std::vector<size_t> sequence(lifetimes.size());
  std::iota(sequence.begin(), sequence.end(), 0);
  std::stable_sort(sequence.begin(), sequence.end(), [&](size_t a, size_t b) {
    return order == Order::kSize ? lifetimes[a].bytes > lifetimes[b].bytes
                                 : lifetimes[a].first < lifetimes[b].first;
  });
  std::vector<size_t> placed;
  for (size_t index : sequence) {
    const Lifetime& current = lifetimes[index];
    const int64_t size = alignUp(current.bytes);
    // Ranges taken by placed values alive at the same time, sorted by offset.
    std::vector<std::pair<int64_t, int64_t>> taken;
    for (size_t other : placed) {
      const Lifetime& o = lifetimes[other];
      if (o.first <= current.last && current.first <= o.last) {
        taken.emplace_back(plan.offsets[other], plan.offsets[other] + alignUp(o.bytes));
      }
    }
    std::sort(taken.begin(), taken.end());
    // First fit: the lowest free gap that holds the value. Best fit: the smallest such gap
    // (the lowest of equals); either way past every taken range when no gap holds it.
    int64_t offset = -1, bestGap = std::numeric_limits<int64_t>::max(), cursor = 0;
    for (const auto& [begin, end] : taken) {
      const int64_t gap = begin - cursor;
      if (gap >= size && gap < bestGap) {
        offset = cursor;
        bestGap = gap;
        if (fit == Fit::kFirst) break;
      }
      cursor = std::max(cursor, end);
    }
    if (offset < 0) offset = cursor;
    plan.offsets[index] = offset;
    plan.arenaBytes = std::max(plan.arenaBytes, offset + size);
    placed.push_back(index);
  }
  return plan;
}

namespace {

// Values that share one buffer (a value and its aliases, an in-place step's input and output)
// form a family: one arena range, alive from its first write to its last read.
class Families {
 public:
  size_t find(size_t v) {
    while (parent_[v] != v) v = parent_[v] = parent_[parent_[v]];
    return v;
  }
  size_t add() {
    parent_.push_back(parent_.size());
    return parent_.size() - 1;
  }
  void unite(size_t into, size_t from) { parent_[find(from)] = find(into); }

 private:
  std::vector<size_t> parent_;
};

}  // namespace

BufferAssignment assignBuffers(const ir::Graph& graph, const BufferRequests& requests) {
  Families families;
  // Runtime values in order of first appearance (so plans are deterministic), and each one's
  // index in `families`.
  std::vector<const ir::Value*> runtimeValues;
  std::unordered_map<const ir::Value*, size_t> id;
  auto idOf = [&](const ir::Value* value) {
    auto [it, inserted] = id.emplace(value, 0);
    if (inserted) {
      it->second = families.add();
      runtimeValues.push_back(value);
    }
    return it->second;
  };
  for (const ir::Value* input : graph.inputs) idOf(input);
  for (const ir::Node* alias : requests.aliases) {
    families.unite(idOf(alias->inputs[0]), idOf(alias->outputs[0]));
  }
  for (const ir::Node* node : requests.steps) {
    for (const ir::Value* output : node->outputs) {
      if (output && !output->constant) idOf(output);
    }
  }

  // Each value's last reader (graph outputs are read after the last step), then each family's.
  const int stepCount = static_cast<int>(requests.steps.size());
  std::vector<int> lastRead(id.size(), -1);
  std::vector<int> firstWrite(id.size(), std::numeric_limits<int>::max());
  for (const ir::Value* input : graph.inputs) firstWrite[id.at(input)] = -1;
  for (int index = 0; index < stepCount; ++index) {
    const ir::Node& node = *requests.steps[index];
    for (const ir::Value* input : node.inputs) {
      if (input && !input->constant) lastRead[idOf(input)] = index;
    }
    for (const ir::Value* output : node.outputs) {
      if (output && !output->constant) firstWrite[id.at(output)] = index;
    }
  }
  lastRead.resize(id.size(), -1);
  firstWrite.resize(id.size(), std::numeric_limits<int>::max());
  for (const ir::Value* output : graph.outputs) {
    if (!output->constant) lastRead[idOf(output)] = stepCount;
  }
  lastRead.resize(id.size(), -1);
  firstWrite.resize(id.size(), std::numeric_limits<int>::max());
  auto familyLastRead = [&](size_t family) {
    int last = -1;
    for (size_t index = 0; index < runtimeValues.size(); ++index) {
      if (families.find(index) == family) last = std::max(last, lastRead[index]);
    }
    return last;
  };

  auto familyHoldsGraphInput = [&](size_t family) {
    for (const ir::Value* graphInput : graph.inputs) {
      if (families.find(id.at(graphInput)) == family) return true;
    }
    return false;
  };

  // In place: a step may take over an input's family when nothing reads that family after it.
  for (int index = 0; index < stepCount && index < static_cast<int>(requests.inPlaceInputs.size());
       ++index) {
    const int input = requests.inPlaceInputs[index];
    if (input < 0) continue;
    const ir::Node& node = *requests.steps[index];
    const size_t inputFamily = families.find(id.at(node.inputs[input]));
    const size_t outputFamily = families.find(id.at(node.outputs[0]));
    if (inputFamily == outputFamily || familyLastRead(inputFamily) != index) continue;
    if (requests.keepInputsIntact && familyHoldsGraphInput(inputFamily)) continue;
    families.unite(inputFamily, outputFamily);
  }

  // One lifetime per family.
  std::unordered_map<size_t, size_t> slot;  // family root -> lifetime index
  std::vector<Lifetime> lifetimes;
  for (size_t index = 0; index < runtimeValues.size(); ++index) {
    const ir::Value* value = runtimeValues[index];
    const size_t root = families.find(index);
    auto [it, inserted] = slot.emplace(root, lifetimes.size());
    const int64_t bytes =
        value->shape.elementCount() * static_cast<int64_t>(ir::dtypeSize(value->dtype));
    if (inserted) {
      lifetimes.push_back({bytes, firstWrite[index], lastRead[index]});
      continue;
    }
    Lifetime& lifetime = lifetimes[it->second];
    lifetime.bytes = std::max(lifetime.bytes, bytes);
    lifetime.first = std::min(lifetime.first, firstWrite[index]);
    lifetime.last = std::max(lifetime.last, lastRead[index]);
  }
  for (Lifetime& lifetime : lifetimes) {
    // A value written but never read still needs its range while its step runs.
    lifetime.last = std::max(lifetime.last, lifetime.first);
  }

  const MemoryPlan memory =
      planMemory(lifetimes, requests.reuse, requests.alignment, requests.fit, requests.order);
  BufferAssignment assignment;
  assignment.arenaBytes = memory.arenaBytes;
  for (size_t index = 0; index < runtimeValues.size(); ++index) {
    assignment.offsets[runtimeValues[index]] = memory.offsets[slot.at(families.find(index))];
  }
  return assignment;
}

}  // namespace kiln::backends
