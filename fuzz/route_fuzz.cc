// libFuzzer harness: route text and route expressions (the tuner's search space) on arbitrary
// text. A route that parses must parse again from its canonical text to the same route; an
// expression that parses must expand (fast search) into routes that are each valid.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "kiln/knobs/route.h"
#include "kiln/knobs/route_expression.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto route = kiln::knobs::Route::parse(text);
  if (route.isOk()) {
    auto again = kiln::knobs::Route::parse(route->canonicalText());
    if (!again.isOk() || !(*again == *route)) std::abort();
  }
  auto expression = kiln::knobs::parseRouteExpression(text);
  if (expression.isOk()) {
    (void)expression->fullCount(1000);
    for (const kiln::knobs::Route& candidate : kiln::knobs::expandFast(*expression)) {
      if (!kiln::knobs::Route::parse(candidate.canonicalText()).isOk()) std::abort();
    }
  }
  return 0;
}
