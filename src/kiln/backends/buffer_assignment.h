// Where each runtime value of a lowered graph lives: one arena per plan, values that share a
// buffer (aliases, in-place steps) grouped into families, and families whose lifetimes do not
// overlap sharing memory. Every backend's lowering uses this; the knobs that steer it are the
// backend's own (cpu.memory.*, cuda.memory.*).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kiln/ir/graph.h"

namespace kiln::backends {

// A value to place: its size and the steps between which it must stay intact (first = the step
// that writes it, or -1 for graph inputs; last = the last step that reads it, or the step count
// for graph outputs).
struct Lifetime {
  int64_t bytes = 0;
  int first = 0;
  int last = 0;
};

// How the reuse planner places a value among the free gaps left by overlapping values already
// placed: the lowest gap that holds it (first), or the smallest (best).
enum class Fit { kFirst, kBest };
// The order in which the reuse planner places values: largest first, or in order of definition.
enum class Order { kSize, kTime };

// Offsets (`alignment`-byte aligned) for each lifetime, and the arena size they need. Without
// reuse every value gets its own range; with it, values whose lifetimes do not overlap share
// memory (greedy: values taken in `order`, each placed by `fit` where it does not collide with an
// overlapping value already placed, or past all of them).
struct MemoryPlan {
  std::vector<int64_t> offsets;
  int64_t arenaBytes = 0;
};
MemoryPlan planMemory(const std::vector<Lifetime>& lifetimes, bool reuse, int64_t alignment = 64,
                      Fit fit = Fit::kFirst, Order order = Order::kSize);

// What a lowering decided about buffers, as assignBuffers' input.
struct BufferRequests {
  // The nodes that run as steps, in execution order.
  std::vector<const ir::Node*> steps;
  // Nodes that run as no step: their output 0 is a second name for their input 0's buffer.
  std::vector<const ir::Node*> aliases;
  // Per step: the input it may write its output over (its kernel reads element i of that input
  // before writing element i of the output), or -1. Taken only where nothing reads the input's
  // buffer after the step.
  std::vector<int> inPlaceInputs;
  // Never write a step's output over a graph input's buffer (a plan that uploads its inputs once
  // and runs many times, as a GPU timing loop does, needs them intact).
  bool keepInputsIntact = false;
  bool reuse = true;
  int64_t alignment = 64;
  Fit fit = Fit::kFirst;
  Order order = Order::kSize;
};

struct BufferAssignment {
  std::unordered_map<const ir::Value*, int64_t> offsets;  // every non-constant value
  int64_t arenaBytes = 0;
};

// Places every non-constant value that the graph's inputs, the steps and the aliases produce.
BufferAssignment assignBuffers(const ir::Graph& graph, const BufferRequests& requests);

}  // namespace kiln::backends
