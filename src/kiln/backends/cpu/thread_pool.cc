#include "kiln/backends/cpu/thread_pool.h"

#include <algorithm>

namespace kiln::cpu {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { workerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
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

void ThreadPool::runChunks() {
  const int64_t chunks = chunks_;
  const int64_t count = count_;
  for (int64_t chunk = nextChunk_.fetch_add(1); chunk < chunks; chunk = nextChunk_.fetch_add(1)) {
    // Chunk c covers [c*count/chunks, (c+1)*count/chunks): balanced and deterministic.
    const int64_t begin = chunk * count / chunks;
    const int64_t end = (chunk + 1) * count / chunks;
    (*fn_)(begin, end);
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
    nextChunk_.store(0);
    busyWorkers_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  wake_.notify_all();
  runChunks();
  std::unique_lock lock(mutex_);
  done_.wait(lock, [this] { return busyWorkers_ == 0; });
  fn_ = nullptr;
}

void ThreadPool::workerLoop() {
  uint64_t seen = 0;
  while (true) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
    }
    runChunks();
    {
      std::lock_guard lock(mutex_);
      if (--busyWorkers_ == 0) done_.notify_one();
    }
  }
}

}  // namespace kiln::cpu
