// Routes for tests of kiln's own NCHW CPU kernels. The default route puts convolutions and
// pools in NHWC (graph.layout) and runs convolutions through oneDNN (cpu.conv.source, where kiln
// is built with it); a test of the NCHW kernels asks for them, unless its route sets those knobs
// itself.
#pragma once

#include <string>

namespace kiln::testing {

// kiln's native kernels in ONNX's NCHW layout (a compile-time constant: knob effect cases are
// registered during static initialisation, before every knob need be).
#if KILN_HAVE_ONEDNN
inline constexpr const char* kNativeNchwRoute = "-graph.layout=nchw -cpu.conv.source=native";
#else
inline constexpr const char* kNativeNchwRoute = "-graph.layout=nchw";
#endif

// kiln's native convolution kernels, in the default layout.
#if KILN_HAVE_ONEDNN
inline constexpr const char* kNativeConvRoute = "-cpu.conv.source=native";
#else
inline constexpr const char* kNativeConvRoute = "";
#endif

// `route` with kNativeNchwRoute's settings for the knobs it leaves unset.
inline std::string nativeNchwRoute(const std::string& route) {
  std::string pinned;
  if (route.find("graph.layout") == std::string::npos) pinned += "-graph.layout=nchw ";
#if KILN_HAVE_ONEDNN
  if (route.find("cpu.conv.source") == std::string::npos) pinned += "-cpu.conv.source=native ";
#endif
  return pinned + route;
}

}  // namespace kiln::testing
