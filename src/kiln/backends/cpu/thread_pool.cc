#include "kiln/backends/cpu/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kiln::cpu {

namespace {

// The CPUs this process may run on, ascending (empty if the kernel would not say).
std::vector<int> allowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return {};
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

}  // namespace

ThreadPool::ThreadPool(int threads, int spinMicros, bool pinWorkers, bool ownChunks)
    : spinMicros_(std::max(spinMicros, 0)),
      ownChunks_(ownChunks),
      claimed_(std::make_unique<std::atomic<bool>[]>(static_cast<size_t>(std::max(threads, 1)))) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { workerLoop(i); });
  if (!pinWorkers || workers_.empty()) return;
  const std::vector<int> cpus = allowedCpus();
  for (size_t i = 0; i < workers_.size(); ++i) {
    int bound = -1;
    if (!cpus.empty()) {
      // Worker i takes the (i+1)-th allowed CPU, leaving the first to the caller's scheduler.
      const int cpu = cpus[(i + 1) % cpus.size()];
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
      if (pthread_setaffinity_np(workers_[i].native_handle(), sizeof(set), &set) == 0) bound = cpu;
    }
    workerCpus_.push_back(bound);
  }
}

template <typename Ready>
bool ThreadPool::spinUntil(Ready ready) const {
  if (spinMicros_ == 0) return ready();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spinMicros_);
  while (true) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
#if defined(__x86_64__)
      _mm_pause();
#endif
    }
    if (std::chrono::steady_clock::now() >= deadline) return ready();
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_.store(true);
  }
  wake_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

int64_t ThreadPool::chunkCount(int64_t count, int64_t grain) const {
  if (count <= 0) return 0;
  grain = std::max<int64_t>(grain, 1);
  const int64_t byGrain = (count + grain - 1) / grain;
  return std::min<int64_t>(byGrain, size());
}

void ThreadPool::runChunks(int self) {
  const int64_t chunks = chunks_;
  const int64_t count = count_;
  // Chunk c covers [c*count/chunks, (c+1)*count/chunks): balanced and deterministic. Thread t
  // (the caller is 0, worker i is i) owns chunk t, so consecutive layers split alike (rows,
  // planes) keep each part of a tensor on the core that wrote it; on the 2-core development
  // machine a core reads what the other wrote 1.4x slower, and overwrites it 2.5x slower, than
  // its own. A thread that wakes late finds its chunk taken by one that finished early; threads
  // beyond the chunks take none.
  if (!ownChunks_) {
    for (int64_t c = nextChunk_.fetch_add(1); c < chunks; c = nextChunk_.fetch_add(1)) {
      (*fn_)(c * count / chunks, (c + 1) * count / chunks);
    }
    return;
  }
  if (self >= chunks) return;
  for (int64_t i = 0; i < chunks; ++i) {
    const int64_t chunk = (self + i) % chunks;
    if (claimed_[chunk].load(std::memory_order_relaxed) ||
        claimed_[chunk].exchange(true, std::memory_order_acq_rel)) {
      continue;
    }
    (*fn_)(chunk * count / chunks, (chunk + 1) * count / chunks);
  }
}

void ThreadPool::parallelFor(int64_t count, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t chunks = chunkCount(count, grain);
  if (chunks == 0) return;
  if (chunks == 1 || workers_.empty()) {
    fn(0, count);
    return;
  }
  {
    std::lock_guard lock(mutex_);
    fn_ = &fn;
    count_ = count;
    chunks_ = chunks;
    for (int64_t c = 0; c < chunks; ++c) claimed_[c].store(false, std::memory_order_relaxed);
    nextChunk_.store(0);
    busyWorkers_.store(static_cast<int>(workers_.size()));
    generation_.fetch_add(1);  // last: a spinning worker that sees it sees the call's fields
  }
  wake_.notify_all();
  runChunks(0);
  if (!spinUntil([this] { return busyWorkers_.load() == 0; })) {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [this] { return busyWorkers_.load() == 0; });
  }
  fn_ = nullptr;
}

void ThreadPool::workerLoop(int self) {
  uint64_t seen = 0;
  while (true) {
    const auto called = [&] { return stopping_.load() || generation_.load() != seen; };
    if (!spinUntil(called)) {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, called);
    }
    if (stopping_.load()) return;
    seen = generation_.load();
    runChunks(self);
    // The last worker out wakes the caller if it sleeps; under the mutex, so that the caller's
    // check of its condition and its sleep cannot fall between the count and the notify.
    if (busyWorkers_.fetch_sub(1) == 1) {
      std::lock_guard lock(mutex_);
      done_.notify_one();
    }
  }
}

}  // namespace kiln::cpu
