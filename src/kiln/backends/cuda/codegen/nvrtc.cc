// NVRTC loaded at run time (see nvrtc.h): the handful of entry points kiln calls, resolved by name
// with the types nvrtc.h declares.
#include "kiln/backends/cuda/codegen/nvrtc.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <nvrtc.h>

#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace kiln::cuda {
namespace {

struct NvrtcLibrary {
  void* handle = nullptr;
  std::string why;  // why handle is null
  decltype(&::nvrtcVersion) version = nullptr;
  decltype(&::nvrtcCreateProgram) createProgram = nullptr;
  decltype(&::nvrtcDestroyProgram) destroyProgram = nullptr;
  decltype(&::nvrtcCompileProgram) compileProgram = nullptr;
  decltype(&::nvrtcGetProgramLogSize) getProgramLogSize = nullptr;
  decltype(&::nvrtcGetProgramLog) getProgramLog = nullptr;
  decltype(&::nvrtcGetCUBINSize) getCubinSize = nullptr;
  decltype(&::nvrtcGetCUBIN) getCubin = nullptr;
  decltype(&::nvrtcGetErrorString) getErrorString = nullptr;
};

template <typename F>
bool resolve(void* handle, const char* symbol, F& function, std::string& why) {
  function = reinterpret_cast<F>(dlsym(handle, symbol));
  if (!function) why = fmt::format("libnvrtc has no {}", symbol);
  return function != nullptr;
}

NvrtcLibrary load() {
  NvrtcLibrary library;
  // The loader's search path first (LD_LIBRARY_PATH, the binary's run path, ldconfig), then the
  // toolkit kiln was built against.
  std::vector<std::string> candidates = {"libnvrtc.so.13", "libnvrtc.so"};
#ifdef KILN_NVRTC_DIR
  candidates.push_back(std::string(KILN_NVRTC_DIR) + "/libnvrtc.so.13");
#endif
  std::string tried;
  for (const std::string& candidate : candidates) {
    library.handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library.handle) break;
    const char* error = dlerror();
    tried +=
        fmt::format("{}{} ({})", tried.empty() ? "" : "; ", candidate, error ? error : "not found");
  }
  if (!library.handle) {
    library.why = "NVRTC (libnvrtc.so.13) could not be loaded: " + tried;
    return library;
  }
  std::string why;
  const bool all =
      resolve(library.handle, "nvrtcVersion", library.version, why) &&
      resolve(library.handle, "nvrtcCreateProgram", library.createProgram, why) &&
      resolve(library.handle, "nvrtcDestroyProgram", library.destroyProgram, why) &&
      resolve(library.handle, "nvrtcCompileProgram", library.compileProgram, why) &&
      resolve(library.handle, "nvrtcGetProgramLogSize", library.getProgramLogSize, why) &&
      resolve(library.handle, "nvrtcGetProgramLog", library.getProgramLog, why) &&
      resolve(library.handle, "nvrtcGetCUBINSize", library.getCubinSize, why) &&
      resolve(library.handle, "nvrtcGetCUBIN", library.getCubin, why) &&
      resolve(library.handle, "nvrtcGetErrorString", library.getErrorString, why);
  if (!all) {
    dlclose(library.handle);
    library = NvrtcLibrary{};
    library.why = why;
  }
  return library;
}

const NvrtcLibrary& nvrtc() {
  static const NvrtcLibrary library = load();
  return library;
}

struct CompiledKernels {
  std::mutex mutex;
  std::map<std::pair<std::string, int>, std::string> cubins;  // (source, sm) -> machine code
  int compilations = 0;
};

CompiledKernels& compiled() {
  static CompiledKernels kernels;
  return kernels;
}

// Destroys the program on every path out of compileToCubin.
struct ProgramGuard {
  const NvrtcLibrary& library;
  nvrtcProgram program = nullptr;
  ~ProgramGuard() {
    if (program) library.destroyProgram(&program);
  }
};

}  // namespace

bool nvrtcAvailable(std::string* why) {
  const NvrtcLibrary& library = nvrtc();
  if (!library.handle && why) *why = library.why;
  return library.handle != nullptr;
}

std::string nvrtcVersion() {
  const NvrtcLibrary& library = nvrtc();
  if (!library.handle) return library.why;
  int major = 0, minor = 0;
  if (library.version(&major, &minor) != NVRTC_SUCCESS) return "unknown";
  return fmt::format("{}.{}", major, minor);
}

Result<std::string> compileToCubin(std::string_view source, std::string_view name, int computeMajor,
                                   int computeMinor) {
  const NvrtcLibrary& library = nvrtc();
  if (!library.handle) return unsupported("{}", library.why);
  const int sm = computeMajor * 10 + computeMinor;
  CompiledKernels& kernels = compiled();
  std::pair<std::string, int> key{std::string(source), sm};
  {
    std::lock_guard<std::mutex> lock(kernels.mutex);
    if (auto it = kernels.cubins.find(key); it != kernels.cubins.end()) return it->second;
  }
  const std::string programName(name);
  ProgramGuard guard{library};
  nvrtcResult result = library.createProgram(&guard.program, key.first.c_str(), programName.c_str(),
                                             0, nullptr, nullptr);
  if (result != NVRTC_SUCCESS) {
    return internalError("NVRTC could not create the program {}: {}", programName,
                         library.getErrorString(result));
  }
  // Machine code for this GPU (no PTX left to JIT), without fast-math: the generated kernels
  // round as the interpreted ones do.
  const std::string arch = fmt::format("--gpu-architecture=sm_{}", sm);
  const char* options[] = {arch.c_str(), "--std=c++17", "--device-as-default-execution-space"};
  result = library.compileProgram(guard.program, 3, options);
  if (result != NVRTC_SUCCESS) {
    size_t logSize = 0;
    std::string log;
    if (library.getProgramLogSize(guard.program, &logSize) == NVRTC_SUCCESS && logSize > 1) {
      log.resize(logSize);
      if (library.getProgramLog(guard.program, log.data()) != NVRTC_SUCCESS) log.clear();
      while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
    }
    return internalError("NVRTC could not compile the generated kernel {} for sm_{} ({}): {}",
                         programName, sm, library.getErrorString(result), log);
  }
  size_t cubinSize = 0;
  if (library.getCubinSize(guard.program, &cubinSize) != NVRTC_SUCCESS || cubinSize == 0) {
    return internalError("NVRTC gave no machine code for {}", programName);
  }
  std::string cubin(cubinSize, '\0');
  if (library.getCubin(guard.program, cubin.data()) != NVRTC_SUCCESS) {
    return internalError("NVRTC could not return the machine code of {}", programName);
  }
  std::lock_guard<std::mutex> lock(kernels.mutex);
  ++kernels.compilations;
  return kernels.cubins.emplace(std::move(key), std::move(cubin)).first->second;
}

int nvrtcCompilations() {
  std::lock_guard<std::mutex> lock(compiled().mutex);
  return compiled().compilations;
}

}  // namespace kiln::cuda
