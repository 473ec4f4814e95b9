// The CUDA runtime as kiln uses it: errors as Status, the device and its fingerprint, and
// owning handles for device memory, streams, events and the vendor libraries' contexts.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/base/status.h"

namespace kiln::cuda {

// ok for cudaSuccess; otherwise an error naming the call and CUDA's reason. Running out of device
// memory is kIo (a resource, like a full disk); a missing device or driver is kUnsupported.
Status cudaStatus(cudaError_t error, std::string_view what);
Status cublasStatus(cublasStatus_t status, std::string_view what);
Status cudnnStatus(cudnnStatus_t status, std::string_view what);

#define KILN_CUDA_CHECK(call) KILN_RETURN_IF_ERROR(::kiln::cuda::cudaStatus((call), #call))
#define KILN_CUBLAS_CHECK(call) KILN_RETURN_IF_ERROR(::kiln::cuda::cublasStatus((call), #call))
#define KILN_CUDNN_CHECK(call) KILN_RETURN_IF_ERROR(::kiln::cuda::cudnnStatus((call), #call))
// After a kernel launch: the launch's own error (bad configuration, no kernel image).
#define KILN_CUDA_CHECK_LAUNCH(what) \
  KILN_RETURN_IF_ERROR(::kiln::cuda::cudaStatus(cudaGetLastError(), (what)))

// The GPU an engine runs on, and the software it was built against: tactics depend on all of it.
struct DeviceInfo {
  int ordinal = 0;
  std::string name;  // "NVIDIA H200"
  int computeMajor = 0;
  int computeMinor = 0;
  int multiprocessors = 0;
  int64_t memoryBytes = 0;
  int64_t l2Bytes = 0;
  int driverVersion = 0;   // 13000 = 13.0
  int runtimeVersion = 0;  // of the CUDA runtime linked in
  size_t cudnnVersion = 0;
  size_t cublasLtVersion = 0;

  std::string computeCapability() const;  // "9.0"
  std::string summary() const;  // "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB), driver 13.0, ..."
};

// The device kiln runs on (device 0 of those CUDA_VISIBLE_DEVICES shows), or kUnsupported saying
// why there is none (no driver, no device). Cached after the first call.
Result<DeviceInfo> currentDevice();
// True when currentDevice() succeeds (tests skip without one).
bool deviceAvailable();
// Every device CUDA_VISIBLE_DEVICES shows, by ordinal (kUnsupported without one): its name and
// its UUID ("GPU-8c6e...", as nvidia-smi writes it), which names one GPU in every process
// whatever CUDA_VISIBLE_DEVICES says.
struct VisibleDevice {
  std::string name;
  std::string uuid;
};
Result<std::vector<VisibleDevice>> visibleDevices();

// Owning wrappers. Each is move-only and frees its resource on destruction.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  ~DeviceMemory();
  DeviceMemory(DeviceMemory&& other) noexcept;
  DeviceMemory& operator=(DeviceMemory&& other) noexcept;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  // cudaMalloc of `bytes` (0 gives no allocation); `what` names the buffer in errors.
  static Result<DeviceMemory> allocate(int64_t bytes, std::string_view what);
  std::byte* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  std::byte* data_ = nullptr;
  int64_t bytes_ = 0;
};

class Stream {
 public:
  Stream() = default;
  ~Stream();
  Stream(Stream&& other) noexcept : stream_(other.stream_) { other.stream_ = nullptr; }
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  static Result<Stream> create(int priority = 0);  // 0: the default priority
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  Event() = default;
  ~Event();
  Event(Event&& other) noexcept : event_(other.event_) { other.event_ = nullptr; }
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  static Result<Event> create();
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Milliseconds between two recorded events (both must have completed).
Result<double> elapsedMs(const Event& start, const Event& stop);

// Page-locked host memory, for copies that overlap and for graph-captured host transfers.
class PinnedMemory {
 public:
  PinnedMemory() = default;
  ~PinnedMemory();
  PinnedMemory(PinnedMemory&& other) noexcept;
  PinnedMemory& operator=(PinnedMemory&& other) noexcept;
  PinnedMemory(const PinnedMemory&) = delete;
  PinnedMemory& operator=(const PinnedMemory&) = delete;

  static Result<PinnedMemory> allocate(int64_t bytes);
  std::byte* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  std::byte* data_ = nullptr;
  int64_t bytes_ = 0;
};

// cuBLASLt and cuDNN contexts, one each per plan.
class LibraryHandles {
 public:
  LibraryHandles() = default;
  ~LibraryHandles();
  LibraryHandles(LibraryHandles&& other) noexcept;
  LibraryHandles& operator=(LibraryHandles&& other) noexcept;
  LibraryHandles(const LibraryHandles&) = delete;
  LibraryHandles& operator=(const LibraryHandles&) = delete;

  // cuDNN's handle is bound to `stream`.
  static Result<LibraryHandles> create(cudaStream_t stream);
  cublasLtHandle_t cublasLt() const { return cublasLt_; }
  cudnnHandle_t cudnn() const { return cudnn_; }

 private:
  void reset();
  cublasLtHandle_t cublasLt_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
};

}  // namespace kiln::cuda
