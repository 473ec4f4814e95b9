// The CPU backend's worker threads. A plan owns one pool (cpu.threads workers, the calling
// thread among them) and hands it to every step through the ExecutionContext; a kernel splits
// its work with parallelFor. Between calls, workers first spin for up to `spinMicros`
// microseconds watching for the next call (cpu.threads.spin_us), then sleep on a condition
// variable, so an idle plan costs nothing; the caller likewise spins before it sleeps while the
// workers finish. A wake-up through the condition variable costs tens of microseconds on a
// virtual machine, which small layers pay on every parallelFor without the spin.
//
// With `pinWorkers` (cpu.threads.affinity=on), worker i (1 <= i < threads) is bound to one CPU:
// the i-th of the process's allowed CPUs (sched_getaffinity), wrapping round when there are more
// workers than CPUs. The calling thread is never pinned: it belongs to the application.
//
//   context.pool().parallelFor(rows, /*grain=*/16, [&](int64_t begin, int64_t end) {
//     for (int64_t r = begin; r < end; ++r) normalizeRow(r);
//   });
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln::cpu {

class ThreadPool {
 public:
  // `threads` >= 1 counts the caller: a pool of 1 starts no worker and runs everything inline.
  // `ownChunks`: thread t runs chunk t of a parallelFor first (see runChunks); otherwise each
  // thread takes the next free chunk.
  explicit ThreadPool(int threads, int spinMicros = 0, bool pinWorkers = false,
                      bool ownChunks = true);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // The CPU each worker was bound to, in worker order (empty without pinWorkers; a worker whose
  // pthread_setaffinity_np failed is left unbound and listed as -1).
  const std::vector<int>& workerCpus() const { return workerCpus_; }
  bool ownChunks() const { return ownChunks_; }

  // Calls fn(begin, end) over disjoint ranges covering [0, count), each at least `grain` long
  // (except the last), on up to size() threads; returns when all have run. Ranges are contiguous
  // and, for a given count, grain and pool size, always the same: results do not depend on
  // scheduling. Not reentrant: a kernel must not call parallelFor from inside fn.
  void parallelFor(int64_t count, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // The number of chunks parallelFor(count, grain) splits into; kernels that keep per-chunk
  // scratch size it with this.
  int64_t chunkCount(int64_t count, int64_t grain) const;

 private:
  void workerLoop(int self);
  // Runs chunk `self` first (the same rows, for a given count and grain, as on every call: what
  // this thread wrote last time is in its own cache), then any chunk a late thread left.
  void runChunks(int self);

  // Spins up to spinMicros_ until `ready` holds; whether it did.
  template <typename Ready>
  bool spinUntil(Ready ready) const;

  const int spinMicros_;
  const bool ownChunks_;
  std::vector<std::thread> workers_;
  std::vector<int> workerCpus_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  // Changed under mutex_ (so that sleepers see them), read without it while spinning.
  std::atomic<uint64_t> generation_{0};  // bumped per parallelFor call
  std::atomic<bool> stopping_{false};
  std::atomic<int> busyWorkers_{0};  // workers still inside the current call

  // The current call (written before generation_ is bumped, read by workers after).
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t count_ = 0;
  int64_t chunks_ = 0;
  std::atomic<int64_t> nextChunk_{0};  // without ownChunks_: the next chunk to take
  // claimed_[c] is set by the thread that runs chunk c; one per thread (chunks never exceed it).
  std::unique_ptr<std::atomic<bool>[]> claimed_;
};

}  // namespace kiln::cpu
