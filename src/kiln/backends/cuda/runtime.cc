// CUDA runtime helpers: Status from error codes, the device fingerprint, owning handles.
#include "kiln/backends/cuda/runtime.h"

#include <fmt/format.h>

#include <mutex>
#include <utility>

namespace kiln::cuda {

Status cudaStatus(cudaError_t error, std::string_view what) {
  if (error == cudaSuccess) return Status::ok();
  const std::string message = fmt::format("CUDA: {} failed: {} ({})", what,
                                          cudaGetErrorString(error), cudaGetErrorName(error));
  switch (error) {
    case cudaErrorMemoryAllocation:
      return Status(StatusCode::kIo, message + " (out of device memory)");
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
      return Status(StatusCode::kUnsupported, message);
    default:
      return Status(StatusCode::kInternal, message);
  }
}

namespace {
// cuBLAS's own name lookup lives in libcublas, which kiln does not link.
const char* cublasStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
    default:
      return "unknown cuBLAS status";
  }
}
}  // namespace

Status cublasStatus(cublasStatus_t status, std::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return Status::ok();
  const std::string message = fmt::format("cuBLASLt: {} failed: {} ({})", what,
                                          cublasStatusName(status), static_cast<int>(status));
  if (status == CUBLAS_STATUS_ALLOC_FAILED) return Status(StatusCode::kIo, message);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return Status(StatusCode::kUnsupported, message);
  return Status(StatusCode::kInternal, message);
}

Status cudnnStatus(cudnnStatus_t status, std::string_view what) {
  if (status == CUDNN_STATUS_SUCCESS) return Status::ok();
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof(detail));
  const std::string message = fmt::format(
      "cuDNN: {} failed: {}{}{}", what, cudnnGetErrorString(status), detail[0] ? ": " : "", detail);
  if (status == CUDNN_STATUS_ALLOC_FAILED) return Status(StatusCode::kIo, message);
  if (status == CUDNN_STATUS_NOT_SUPPORTED || status == CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH) {
    return Status(StatusCode::kUnsupported, message);
  }
  return Status(StatusCode::kInternal, message);
}

std::string DeviceInfo::computeCapability() const {
  return fmt::format("{}.{}", computeMajor, computeMinor);
}

std::string DeviceInfo::summary() const {
  return fmt::format(
      "{} (sm_{}{}, {} SMs, {:.1f} GiB), driver {}.{}, runtime {}.{}, cuDNN {}, cuBLASLt {}", name,
      computeMajor, computeMinor, multiprocessors,
      static_cast<double>(memoryBytes) / (1024.0 * 1024.0 * 1024.0), driverVersion / 1000,
      driverVersion % 1000 / 10, runtimeVersion / 1000, runtimeVersion % 1000 / 10, cudnnVersion,
      cublasLtVersion);
}

Result<DeviceInfo> currentDevice() {
  static std::once_flag once;
  static Result<DeviceInfo> cached = Status(StatusCode::kInternal, "not queried");
  std::call_once(once, [] {
    cached = []() -> Result<DeviceInfo> {
      int count = 0;
      const cudaError_t error = cudaGetDeviceCount(&count);
      if (error != cudaSuccess || count == 0) {
        return Status(StatusCode::kUnsupported,
                      fmt::format("no CUDA device is visible ({})",
                                  error == cudaSuccess ? "the driver reports none"
                                                       : cudaGetErrorString(error)));
      }
      DeviceInfo info;
      KILN_CUDA_CHECK(cudaSetDevice(0));
      cudaDeviceProp props{};
      KILN_CUDA_CHECK(cudaGetDeviceProperties(&props, 0));
      info.name = props.name;
      info.computeMajor = props.major;
      info.computeMinor = props.minor;
      info.multiprocessors = props.multiProcessorCount;
      info.memoryBytes = static_cast<int64_t>(props.totalGlobalMem);
      info.l2Bytes = props.l2CacheSize;
      KILN_CUDA_CHECK(cudaDriverGetVersion(&info.driverVersion));
      KILN_CUDA_CHECK(cudaRuntimeGetVersion(&info.runtimeVersion));
      info.cudnnVersion = cudnnGetVersion();
      info.cublasLtVersion = cublasLtGetVersion();
      return info;
    }();
  });
  return cached;
}

bool deviceAvailable() { return currentDevice().isOk(); }

Result<std::vector<VisibleDevice>> visibleDevices() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    return Status(
        StatusCode::kUnsupported,
        fmt::format("no CUDA device is visible ({})",
                    error == cudaSuccess ? "the driver reports none" : cudaGetErrorString(error)));
  }
  std::vector<VisibleDevice> devices;
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    cudaDeviceProp props{};
    KILN_CUDA_CHECK(cudaGetDeviceProperties(&props, ordinal));
    std::string uuid = "GPU-";
    for (int i = 0; i < 16; ++i) {
      if (i == 4 || i == 6 || i == 8 || i == 10) uuid += '-';
      uuid += fmt::format("{:02x}", static_cast<unsigned char>(props.uuid.bytes[i]));
    }
    devices.push_back({props.name, uuid});
  }
  return devices;
}

DeviceMemory::~DeviceMemory() {
  if (data_) cudaFree(data_);
}
DeviceMemory::DeviceMemory(DeviceMemory&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
DeviceMemory& DeviceMemory::operator=(DeviceMemory&& other) noexcept {
  if (this != &other) {
    if (data_) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}
Result<DeviceMemory> DeviceMemory::allocate(int64_t bytes, std::string_view what) {
  DeviceMemory memory;
  if (bytes <= 0) return memory;
  void* data = nullptr;
  KILN_RETURN_IF_ERROR(cudaStatus(cudaMalloc(&data, static_cast<size_t>(bytes)),
                                  fmt::format("allocating {} ({} bytes)", what, bytes)));
  memory.data_ = static_cast<std::byte*>(data);
  memory.bytes_ = bytes;
  return memory;
}

Stream::~Stream() {
  if (stream_) cudaStreamDestroy(stream_);
}
Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}
Result<Stream> Stream::create(int priority) {
  Stream stream;
  KILN_CUDA_CHECK(cudaStreamCreateWithPriority(&stream.stream_, cudaStreamNonBlocking, priority));
  return stream;
}

Event::~Event() {
  if (event_) cudaEventDestroy(event_);
}
Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (event_) cudaEventDestroy(event_);
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}
Result<Event> Event::create() {
  Event event;
  KILN_CUDA_CHECK(cudaEventCreate(&event.event_));
  return event;
}

Result<double> elapsedMs(const Event& start, const Event& stop) {
  float ms = 0;
  KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
  return static_cast<double>(ms);
}

PinnedMemory::~PinnedMemory() {
  if (data_) cudaFreeHost(data_);
}
PinnedMemory::PinnedMemory(PinnedMemory&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
PinnedMemory& PinnedMemory::operator=(PinnedMemory&& other) noexcept {
  if (this != &other) {
    if (data_) cudaFreeHost(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}
Result<PinnedMemory> PinnedMemory::allocate(int64_t bytes) {
  PinnedMemory memory;
  if (bytes <= 0) return memory;
  void* data = nullptr;
  KILN_CUDA_CHECK(cudaMallocHost(&data, static_cast<size_t>(bytes)));
  memory.data_ = static_cast<std::byte*>(data);
  memory.bytes_ = bytes;
  return memory;
}

LibraryHandles::~LibraryHandles() { reset(); }
void LibraryHandles::reset() {
  if (cublasLt_) cublasLtDestroy(cublasLt_);
  if (cudnn_) cudnnDestroy(cudnn_);
  cublasLt_ = nullptr;
  cudnn_ = nullptr;
}
LibraryHandles::LibraryHandles(LibraryHandles&& other) noexcept
    : cublasLt_(std::exchange(other.cublasLt_, nullptr)),
      cudnn_(std::exchange(other.cudnn_, nullptr)) {}
LibraryHandles& LibraryHandles::operator=(LibraryHandles&& other) noexcept {
  if (this != &other) {
    reset();
    cublasLt_ = std::exchange(other.cublasLt_, nullptr);
    cudnn_ = std::exchange(other.cudnn_, nullptr);
  }
  return *this;
}
Result<LibraryHandles> LibraryHandles::create(cudaStream_t stream) {
  LibraryHandles handles;
  KILN_CUBLAS_CHECK(cublasLtCreate(&handles.cublasLt_));
  KILN_CUDNN_CHECK(cudnnCreate(&handles.cudnn_));
  KILN_CUDNN_CHECK(cudnnSetStream(handles.cudnn_, stream));
  return handles;
}

}  // namespace kiln::cuda
