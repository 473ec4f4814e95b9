// The tuning report as one self-contained HTML page: no script, no style sheet or font from the
// network, every chart an inline SVG drawn here from the trial records.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "kiln/tune/report.h"
#include "kiln/tune/tuner.h"

namespace kiln::tune {

namespace {

std::string esc(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string clipped(const std::string& text, size_t chars) {
  return text.size() <= chars ? text : text.substr(0, chars - 3) + "...";
}

bool timed(const TrialRecord* r) { return r && r->timing.has_value(); }
bool eligibleRecord(const TrialRecord* r) { return timed(r) && r->status == TrialStatus::kOk; }

// Round numbers for an axis from 0 (or lo) to hi: about `count` ticks at 1, 2 or 5 times a power
// of ten.
std::vector<double> niceTicks(double lo, double hi, int count) {
  std::vector<double> ticks;
  if (!(hi > lo)) return ticks;
  const double raw = (hi - lo) / count;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * power >= raw) {
      step = m * power;
      break;
    }
  }
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) {
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  }
  return ticks;
}

std::string number(double v) { return fmt::format("{:.4g}", v); }

// The tokens of a canonical route ("-a=x -b@n*=y").
std::vector<std::string> tokensOf(const std::string& route) {
  std::vector<std::string> tokens;
  std::istringstream words(route);
  for (std::string word; words >> word;) tokens.push_back(word);
  return tokens;
}

// Every route's median and interval, sorted fastest first, the default and the winner marked.
std::string routeChart(const ReportInput& input, const std::vector<const TrialRecord*>& rows,
                       const TrialRecord* base) {
  const Decision& d = *input.decision;
  const double labelWidth = 430, plotWidth = 470, rowHeight = 18, top = 28, left = labelWidth + 10;
  double hi = 0;
  for (const TrialRecord* r : rows) hi = std::max(hi, r->timing->ciHigh);
  hi *= 1.05;
  const auto ticks = niceTicks(0, hi, 5);
  if (!ticks.empty()) hi = std::max(hi, ticks.back());
  auto x = [&](double ms) { return left + plotWidth * ms / hi; };
  const double height = top + rowHeight * static_cast<double>(rows.size()) + 30;
  std::string svg = fmt::format(
      R"(<svg class="chart" id="route-chart" xmlns="http://www.w3.org/2000/svg" width="{0}" )"
      R"(height="{1}" viewBox="0 0 {0} {1}" role="img" aria-label="median time of every route">)",
      left + plotWidth + 20, height);
  svg += "\n";
  for (double t : ticks) {
    svg +=
        fmt::format(R"(<line class="grid" x1="{0:.1f}" y1="{1}" x2="{0:.1f}" y2="{2:.1f}"/>)"
                    R"(<text class="tick" x="{0:.1f}" y="{3:.1f}" text-anchor="middle">{4}</text>)",
                    x(t), top - 6, height - 24, height - 10, number(t));
    svg += "\n";
  }
  svg += fmt::format(R"(<text class="axis" x="{:.1f}" y="14" text-anchor="middle">median ms, )"
                     R"(with its 95% interval</text>)",
                     left + plotWidth / 2);
  svg += "\n";
  if (eligibleRecord(base)) {
    svg += fmt::format(
        R"(<line class="default-line" x1="{0:.1f}" y1="{1}" x2="{0:.1f}" y2="{2:.1f}"/>)",
        x(base->timing->summary.median), top - 6, height - 24);
    svg += "\n";
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const TrialRecord* r = rows[i];
    const double y = top + rowHeight * (static_cast<double>(i) + 0.5);
    const bool isDefault = r->route == d.baseline;
    const bool isWinner = d.winner && r->route == *d.winner;
    std::string kind = r->status == TrialStatus::kOk ? "ok" : "fail";
    if (isDefault) kind += " default";
    if (isWinner) kind += " winner";
    std::string label = clipped(shown(r->route), 64);
    if (isDefault && !r->route.empty()) label += "  [default]";
    if (isWinner && !isDefault) label += "  [winner]";
    if (r->status != TrialStatus::kOk) label += fmt::format("  [{}]", trialStatusName(r->status));
    svg += fmt::format(
        R"(<g class="route {0}"><title>{1}: median {2:.4f} ms [{3:.4f}, {4:.4f}], {5}</title>)"
        R"(<text class="label" x="{6}" y="{7:.1f}" text-anchor="end">{8}</text>)"
        R"(<line class="interval" x1="{9:.1f}" y1="{7:.1f}" x2="{10:.1f}" y2="{7:.1f}"/>)"
        R"(<circle class="median" cx="{11:.1f}" cy="{7:.1f}" r="4"/></g>)",
        kind, esc(shown(r->route)), r->timing->summary.median, r->timing->ciLow, r->timing->ciHigh,
        trialStatusName(r->status), labelWidth, y + 4, esc(label), x(r->timing->ciLow),
        x(r->timing->ciHigh), x(r->timing->summary.median));
    svg += "\n";
  }
  svg += "</svg>\n";
  return svg;
}

// Each timed route's worst accuracy loss (log scale) against its speedup over the default, with
// the threshold drawn across.
std::string lossChart(const ReportInput& input, const std::vector<const TrialRecord*>& rows,
                      const TrialRecord* base) {
  const Decision& d = *input.decision;
  const double threshold = input.options->accuracy.threshold;
  const double left = 70, width = 560, top = 20, height = 300;
  double xLo = 1, xHi = 1;
  double yLo = threshold > 0 ? threshold : 1, yHi = threshold > 0 ? threshold : 1;
  std::vector<std::pair<const TrialRecord*, double>> points;
  for (const TrialRecord* r : rows) {
    if (r->accuracy.empty()) continue;
    const double speedup = base->timing->summary.median / r->timing->summary.median;
    points.push_back({r, speedup});
    xLo = std::min(xLo, speedup);
    xHi = std::max(xHi, speedup);
    const double loss = worstLoss(*r);
    if (std::isfinite(loss) && loss > 0) {
      yLo = std::min(yLo, loss);
      yHi = std::max(yHi, loss);
    }
  }
  const double margin = std::max(0.02, (xHi - xLo) * 0.08);
  xLo = std::max(0.0, xLo - margin);
  xHi += margin;
  // Decades of the loss; a loss of exactly 0 is drawn on the bottom edge, a non-finite one on
  // the top edge, each labelled.
  const double dLo = std::floor(std::log10(yLo)) - 1, dHi = std::ceil(std::log10(yHi)) + 1;
  auto x = [&](double s) { return left + width * (s - xLo) / (xHi - xLo); };
  auto y = [&](double loss) {
    if (!std::isfinite(loss)) return top;
    if (loss <= 0) return top + height;
    return top + height * (dHi - std::log10(loss)) / (dHi - dLo);
  };
  std::string svg = fmt::format(
      R"(<svg class="chart" id="loss-chart" xmlns="http://www.w3.org/2000/svg" width="{0}" )"
      R"(height="{1}" viewBox="0 0 {0} {1}" role="img" aria-label="accuracy loss against )"
      R"(speedup">)",
      left + width + 160, top + height + 45);
  svg += "\n";
  const int decadeStep = std::max(1, static_cast<int>(std::ceil((dHi - dLo) / 8)));
  for (double dec = dLo; dec <= dHi; dec += decadeStep) {
    svg += fmt::format(
        R"(<line class="grid" x1="{0}" y1="{1:.1f}" x2="{2}" y2="{1:.1f}"/>)"
        R"(<text class="tick" x="{3}" y="{4:.1f}" text-anchor="end">1e{5:.0f}</text>)",
        left, y(std::pow(10.0, dec)), left + width, left - 6, y(std::pow(10.0, dec)) + 4, dec);
    svg += "\n";
  }
  for (double t : niceTicks(xLo, xHi, 6)) {
    svg += fmt::format(R"(<line class="grid" x1="{0:.1f}" y1="{1}" x2="{0:.1f}" y2="{2}"/>)"
                       R"(<text class="tick" x="{0:.1f}" y="{3}" text-anchor="middle">{4}x</text>)",
                       x(t), top, top + height, top + height + 16, number(t));
    svg += "\n";
  }
  svg += fmt::format(
      R"(<text class="axis" x="{:.1f}" y="{}" text-anchor="middle">speedup over the default )"
      R"(route (its median over the route's)</text>)"
      R"s(<text class="axis" x="14" y="{:.1f}" transform="rotate(-90 14 {:.1f})" )s"
      R"s(text-anchor="middle">worst loss ({})</text>)s",
      left + width / 2, top + height + 36, top + height / 2, top + height / 2,
      metricName(input.options->accuracy.metric));
  svg += "\n";
  if (threshold > 0) {
    svg += fmt::format(R"(<line class="threshold" x1="{0}" y1="{1:.1f}" x2="{2}" y2="{1:.1f}"/>)"
                       R"(<text class="threshold-label" x="{3}" y="{4:.1f}">threshold {5}</text>)",
                       left, y(threshold), left + width, left + width + 6, y(threshold) + 4,
                       number(threshold));
    svg += "\n";
  }
  svg += fmt::format(R"(<line class="default-line" x1="{0:.1f}" y1="{1}" x2="{0:.1f}" y2="{2}"/>)",
                     x(1.0), top, top + height);
  svg += "\n";
  for (const auto& [r, speedup] : points) {
    const double loss = worstLoss(*r);
    std::string kind = r->status == TrialStatus::kOk ? "ok" : "fail";
    if (r->route == d.baseline) kind += " default";
    if (d.winner && r->route == *d.winner) kind += " winner";
    svg += fmt::format(
        R"(<g class="point {0}"><title>{1}: {2:.3f}x, loss {3}{4}</title>)"
        R"(<circle cx="{5:.1f}" cy="{6:.1f}" r="5"/></g>)",
        kind, esc(shown(r->route)), speedup, std::isfinite(loss) ? number(loss) : "non-finite",
        r->status == TrialStatus::kOk ? "" : " (" + std::string(trialStatusName(r->status)) + ")",
        x(speedup), y(loss));
    svg += "\n";
  }
  svg += "</svg>\n";
  return svg;
}

struct KnobEffect {
  std::string knob, value, route;
  double speedup = 0;
  bool significant = false;
  std::string status;
};

// Phase one's routes that differ from the default in exactly one token: each is the effect of
// one knob value alone (a fast search is made of them; a full search contains them).
std::vector<KnobEffect> knobEffects(const ReportInput& input, const TrialRecord* base) {
  std::vector<KnobEffect> effects;
  const auto baseTokens = tokensOf(input.decision->baseline);
  const std::set<std::string> baseSet(baseTokens.begin(), baseTokens.end());
  for (const auto& r : *input.records) {
    if (r.phase != 1 || r.route == input.decision->baseline) continue;
    std::vector<std::string> added;
    for (const auto& token : tokensOf(r.route)) {
      if (!baseSet.count(token)) added.push_back(token);
    }
    if (added.size() != 1) continue;
    const std::string& token = added.front();
    const size_t eq = token.find('=');
    KnobEffect e;
    e.knob = token.substr(token.starts_with('-') ? 1 : 0,
                          eq == std::string::npos ? std::string::npos : eq - 1);
    e.value = eq == std::string::npos ? "" : token.substr(eq + 1);
    e.route = r.route;
    e.status = trialStatusName(r.status);
    if (timed(&r)) {
      e.speedup = base->timing->summary.median / r.timing->summary.median;
      e.significant = r.status == TrialStatus::kOk &&
                      significantlyFaster(*r.timing, *base->timing, input.drift);
    }
    effects.push_back(e);
  }
  std::stable_sort(effects.begin(), effects.end(), [](const auto& a, const auto& b) {
    return a.knob != b.knob ? a.knob < b.knob : a.speedup > b.speedup;
  });
  return effects;
}

std::string effectChart(const std::vector<KnobEffect>& effects) {
  const double labelWidth = 380, plotWidth = 400, rowHeight = 18, top = 26, left = labelWidth + 10;
  double lo = 1, hi = 1;
  for (const auto& e : effects) {
    if (e.speedup > 0) {
      lo = std::min(lo, e.speedup);
      hi = std::max(hi, e.speedup);
    }
  }
  // Log scale, symmetric about 1x, so that 2x faster and 2x slower are bars of one length.
  const double reach = std::max({std::abs(std::log2(lo)), std::abs(std::log2(hi)), 0.05}) * 1.1;
  auto x = [&](double s) { return left + plotWidth * (0.5 + std::log2(s) / (2 * reach)); };
  const double height = top + rowHeight * static_cast<double>(effects.size()) + 10;
  std::string svg = fmt::format(
      R"(<svg class="chart" id="effect-chart" xmlns="http://www.w3.org/2000/svg" width="{0}" )"
      R"(height="{1}" viewBox="0 0 {0} {1}" role="img" aria-label="effect of each knob">)",
      left + plotWidth + 200, height);
  svg += fmt::format(
      R"(<text class="axis" x="{0:.1f}" y="12" text-anchor="middle">slower | 1x | faster )"
      R"((log scale, {1:.2f}x to {2:.2f}x)</text>)"
      R"(<line class="default-line" x1="{0:.1f}" y1="{3}" x2="{0:.1f}" y2="{4:.1f}"/>)",
      x(1.0), std::exp2(-reach), std::exp2(reach), top - 6, height - 4);
  svg += "\n";
  for (size_t i = 0; i < effects.size(); ++i) {
    const KnobEffect& e = effects[i];
    const double y = top + rowHeight * static_cast<double>(i);
    std::string kind = e.status != "ok" ? "fail" : e.significant ? "gain" : "none";
    std::string value = e.speedup > 0 ? fmt::format("{:.3f}x", e.speedup) : std::string("no time");
    if (e.status != "ok") value += " " + e.status;
    const double x0 = x(1.0), x1 = e.speedup > 0 ? x(e.speedup) : x0;
    svg += fmt::format(R"(<g class="effect {0}"><title>{1}</title>)"
                       R"(<text class="label" x="{2}" y="{3:.1f}" text-anchor="end">{4}</text>)"
                       R"(<rect x="{5:.1f}" y="{6:.1f}" width="{7:.1f}" height="{8:.1f}"/>)"
                       R"(<text class="value" x="{9:.1f}" y="{3:.1f}">{10}</text></g>)",
                       kind, esc(e.route), labelWidth, y + 13,
                       esc(clipped(e.knob + "=" + e.value, 56)), std::min(x0, x1), y + 3,
                       std::max(1.0, std::abs(x1 - x0)), rowHeight - 6, left + plotWidth + 4,
                       esc(value));
    svg += "\n";
  }
  svg += "</svg>\n";
  return svg;
}

const char* kStyle = R"(
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1100px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 8px 0; } td, th { padding: 3px 8px;
  border-bottom: 1px solid #eee; text-align: left; vertical-align: top; }
th { background: #f6f6f6; } code, pre { font: 12px/1.4 ui-monospace, monospace; }
pre { background: #f6f6f6; padding: 8px; overflow-x: auto; white-space: pre-wrap; }
.winner-box { background: #eef8ee; border: 1px solid #9c9; padding: 10px 14px; }
.nowinner-box { background: #fbeeee; border: 1px solid #c99; padding: 10px 14px; }
svg.chart { display: block; margin: 10px 0; }
svg text { font: 11px system-ui, sans-serif; fill: #333; }
svg .axis { font-size: 12px; } svg .grid { stroke: #e6e6e6; }
svg .label { font: 11px ui-monospace, monospace; }
svg .interval { stroke: #4a7fb5; stroke-width: 2; } svg .median { fill: #1f5f9f; }
svg .fail .interval { stroke: #d9a066; } svg .fail .median { fill: #c0651a; }
svg .default .median { fill: #222; } svg .default .label { font-weight: bold; }
svg .winner .median { fill: #2a9d3a; } svg .winner .label { fill: #1d7a2b; font-weight: bold; }
svg .default-line { stroke: #222; stroke-dasharray: 4 3; }
svg .threshold { stroke: #c0392b; stroke-dasharray: 6 3; stroke-width: 1.5; }
svg .threshold-label { fill: #c0392b; }
svg .point circle { fill: #1f5f9f; fill-opacity: 0.75; }
svg .point.fail circle { fill: #c0651a; } svg .point.default circle { fill: #222; }
svg .point.winner circle { fill: #2a9d3a; stroke: #111; }
svg .effect rect { fill: #bbb; } svg .effect.gain rect { fill: #2a9d3a; }
svg .effect.fail rect { fill: #c0651a; }
.status-ok { color: #1d7a2b; } .status-fail { color: #b03a2e; }
)";

}  // namespace

bool isHtmlReportPath(const std::string& path) {
  std::string lower = path;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower.ends_with(".html") || lower.ends_with(".htm");
}

std::string htmlReport(const ReportInput& input) {
  const TuneOptions& o = *input.options;
  const Decision& d = *input.decision;
  auto header = [&](const std::string& key) {
    auto it = input.header->find(key);
    return it == input.header->end() ? std::string() : it->second;
  };
  const TrialRecord* base = findRoute(input, d.baseline);
  const bool baseOk = eligibleRecord(base);

  std::string h = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  h += fmt::format("<title>kiln tuning report: {}</title>\n", esc(header("model_path")));
  h += fmt::format("<style>{}</style>\n</head>\n<body>\n", kStyle);
  h += "<h1>kiln tuning report</h1>\n";

  // ---- the decision first: what a reader came for ----
  h += "<h2 id=\"decision\">Decision</h2>\n";
  if (!d.winner) {
    h += fmt::format("<div class=\"nowinner-box\"><p><b>No winner.</b> {}</p></div>\n",
                     esc(d.reason));
  } else {
    const TrialRecord* winner = findRoute(input, *d.winner);
    h += "<div class=\"winner-box\">\n";
    h += fmt::format("<p>Winner: <code id=\"winner-route\">{}</code>{}{}</p>\n",
                     esc(shown(*d.winner)), d.defaultWon() ? " (the default route)" : "",
                     d.provisional ? " &mdash; <b>provisional</b>" : "");
    if (winner && winner->timing) {
      h += fmt::format("<p>Median {:.4f} ms [{:.4f}, {:.4f}]", winner->timing->summary.median,
                       winner->timing->ciLow, winner->timing->ciHigh);
      if (d.comparison) {
        h += fmt::format(
            "; <b>{:.3f}x</b> the default's speed ({:.0f}% interval {:.3f}&ndash;{:.3f}, {} "
            "interleaved pairs)",
            d.comparison->speedup(), d.comparison->confidence * 100, d.comparison->speedupLow(),
            d.comparison->speedupHigh(), d.comparison->pairs);
      }
      h += ".</p>\n";
    }
    h += fmt::format("<p>Why it won: {}.</p>\n", esc(d.reason));
    if (winner && !d.defaultWon()) {
      // What the winner changed against the default, token by token.
      const auto baseTokens = tokensOf(d.baseline);
      const std::set<std::string> baseSet(baseTokens.begin(), baseTokens.end());
      std::vector<std::string> changed;
      for (const auto& token : tokensOf(winner->route)) {
        if (!baseSet.count(token)) changed.push_back(token);
      }
      if (!changed.empty()) {
        h += "<p>Changed from the default route:</p><ul>";
        for (const auto& token : changed) h += fmt::format("<li><code>{}</code></li>", esc(token));
        h += "</ul>\n";
      }
    }
    if (winner && !winner->accuracy.empty()) {
      h += "<p>Accuracy of the winner:</p><table><tr><th>output</th><th>loss</th>"
           "<th>threshold</th></tr>\n";
      for (const auto& a : winner->accuracy) {
        h +=
            fmt::format("<tr><td><code>{}</code></td><td>{}</td><td>{}</td></tr>\n", esc(a.output),
                        std::isfinite(a.loss) ? number(a.loss) : "non-finite", number(a.threshold));
      }
      h += "</table>\n";
    }
    h += "</div>\n";
  }
  for (const auto& note : d.notes) h += fmt::format("<p><b>Note:</b> {}.</p>\n", esc(note));

  // ---- settings and target ----
  h += "<h2 id=\"settings\">Settings</h2>\n<table>\n";
  auto row = [&](std::string_view name, const std::string& valueHtml) {
    h += fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", name, valueHtml);
  };
  row("model",
      fmt::format("<code>{}</code> ({})", esc(header("model_path")), esc(header("model_hash"))));
  if (!o.shapes.empty()) row("shapes", fmt::format("<code>{}</code>", esc(o.shapes)));
  row("backend", esc(o.backend));
  row("search", fmt::format("{} over <code>{}</code>", searchModeName(o.search),
                            esc(expressionTokens(o.expression))));
  row("default route", fmt::format("<code>{}</code>", esc(shown(d.baseline))));
  std::string accuracy = fmt::format("{} per output, threshold {}", metricName(o.accuracy.metric),
                                     number(o.accuracy.threshold));
  for (const auto& [name, threshold] : o.accuracy.perOutput) {
    accuracy += fmt::format(", <code>{}</code> {}", esc(name), number(threshold));
  }
  if (o.accuracy.metric == Metric::kL0) {
    accuracy += fmt::format(" (atol {}, rtol {})", o.accuracy.atol, o.accuracy.rtol);
  }
  row("accuracy", accuracy);
  row("references", input.generatedReferences
                        ? "<b>generated</b> by kiln's reference executor on seeded inputs (none "
                          "were given)"
                        : "given by the user");
  row("timing per trial",
      fmt::format("{:.0f} ms warm-up, then at least {} runs and {} s; medians with their 95% "
                  "order-statistic interval",
                  o.timing.warmUpMs, o.timing.minIterations, o.timing.minSeconds));
  if (input.control && input.control->timing && baseOk) {
    row("control", fmt::format("the default route timed again after phase one: {:.4f} ms, then "
                               "{:.4f} ms, a drift of {:.2f}% that every gain must also clear",
                               base->timing->summary.median, input.control->timing->summary.median,
                               100 * input.drift));
  }
  row("command", fmt::format("<code>{}</code>", esc(header("command_line"))));
  row("run", fmt::format("started {}; {} trials; this pass took {:.1f} s",
                         esc(header("created_at")), input.records->size(), input.elapsedSeconds));
  h += "</table>\n";
  const nlohmann::json target = nlohmann::json::parse(header("target"), nullptr, false);
  h += fmt::format(
      "<p>Target fingerprint (a cache or engine tuned here is refused on another "
      "target):</p>\n<pre id=\"target\">{}</pre>\n",
      esc(target.is_discarded() ? header("target") : target.dump(2)));

  // ---- charts ----
  std::vector<const TrialRecord*> timedRows;
  for (const auto& r : *input.records) {
    if (timed(&r)) timedRows.push_back(&r);
  }
  std::stable_sort(timedRows.begin(), timedRows.end(), [](auto* a, auto* b) {
    return a->timing->summary.median < b->timing->summary.median;
  });
  h += "<h2 id=\"routes-chart\">Every route's time</h2>\n";
  if (timedRows.empty()) {
    h += "<p>No route was timed.</p>\n";
  } else {
    h += "<p>Each timed route's median with its 95% interval, fastest first; the dashed line is "
         "the default route's median. Routes that missed the accuracy threshold are drawn in "
         "orange.</p>\n";
    h += routeChart(input, timedRows, base);
  }
  h += "<h2 id=\"loss-chart-section\">Accuracy against speed</h2>\n";
  if (!baseOk || timedRows.empty()) {
    h += "<p>The default route has no time, so no speedup can be drawn.</p>\n";
  } else {
    h += fmt::format(
        "<p>Each timed route's worst loss over its outputs ({}, log scale) against its speedup "
        "over the default; routes above the red threshold line are excluded. A loss of exactly 0 "
        "sits on the bottom edge, a non-finite one on the top edge.</p>\n",
        metricName(o.accuracy.metric));
    h += lossChart(input, timedRows, base);
  }
  const auto effects = baseOk ? knobEffects(input, base) : std::vector<KnobEffect>{};
  h += "<h2 id=\"effects\">The effect of each knob</h2>\n";
  if (effects.empty()) {
    h += "<p>No phase-one route changed exactly one knob from the default (or the default has "
         "no time).</p>\n";
  } else {
    h += "<p>Phase one's routes that change one knob from the default route, as speedup over "
         "it; green bars are gains that cleared the measured noise (the intervals and the "
         "drift).</p>\n";
    h += effectChart(effects);
  }

  // ---- failures ----
  h += "<h2 id=\"failures\">Failures</h2>\n";
  std::vector<const TrialRecord*> failed;
  for (const auto& r : *input.records) {
    if (r.status != TrialStatus::kOk) failed.push_back(&r);
  }
  if (failed.empty()) {
    h += "<p>No trial failed.</p>\n";
  } else {
    h += "<table id=\"failure-table\"><tr><th>route</th><th>status</th><th>reason</th></tr>\n";
    for (const TrialRecord* r : failed) {
      h += fmt::format(
          "<tr><td><code>{}</code></td><td class=\"status-fail\">{}</td><td>{}</td></tr>\n",
          esc(shown(r->route)), trialStatusName(r->status), esc(r->message));
    }
    h += "</table>\n";
  }

  // ---- every route ----
  h += "<h2 id=\"all-routes\">Every route</h2>\n<table id=\"route-table\"><tr><th>#</th>"
       "<th>phase</th><th>route</th><th>status</th><th>median ms [95%]</th><th>speedup</th>"
       "<th>worst loss</th><th>build s</th></tr>\n";
  for (const auto& r : *input.records) {
    std::string time = "&mdash;", speedup = "&mdash;", loss = "&mdash;";
    if (r.timing) {
      time = fmt::format("{:.4f} [{:.4f}, {:.4f}]", r.timing->summary.median, r.timing->ciLow,
                         r.timing->ciHigh);
      if (baseOk && r.route != d.baseline) {
        speedup = fmt::format(
            "{:.3f}x{}", base->timing->summary.median / r.timing->summary.median,
            significantlyFaster(*r.timing, *base->timing, input.drift) ? " (significant)" : "");
      }
    }
    if (!r.accuracy.empty()) {
      const double worst = worstLoss(r);
      loss = std::isfinite(worst) ? number(worst) : "non-finite";
    }
    const bool isWinner = d.winner && r.route == *d.winner;
    h += fmt::format(
        "<tr{}><td>{}</td><td>{}</td><td><code>{}</code>{}</td><td class=\"status-{}\">{}</td>"
        "<td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
        isWinner ? " class=\"winner-row\"" : "", r.iteration, r.phase, esc(shown(r.route)),
        isWinner ? " <b>winner</b>" : "", r.status == TrialStatus::kOk ? "ok" : "fail",
        trialStatusName(r.status), time, speedup, loss,
        r.buildMs > 0 ? fmt::format("{:.2f}", r.buildMs / 1000) : "&mdash;");
  }
  h += "</table>\n";
  if (o.search == SearchMode::kMixed) {
    h += "<h2 id=\"phase-two\">Mixed search, phase two</h2>\n<p>";
    h += input.secondPhaseKnobs.empty()
             ? std::string("No knobs were combined")
             : fmt::format("Combined: <code>{}</code>",
                           esc(fmt::format("{}", fmt::join(input.secondPhaseKnobs, " "))));
    h += input.secondPhaseNote.empty() ? ".</p>\n" : " (" + esc(input.secondPhaseNote) + ").</p>\n";
  }
  if (!input.comparisons->empty()) {
    h += "<h2 id=\"finalists\">Finalists, re-measured interleaved with the default</h2>\n"
         "<table><tr><th>route</th><th>pairs</th><th>speedup [interval]</th>"
         "<th>significant</th></tr>\n";
    for (const auto& c : *input.comparisons) {
      h += fmt::format(
          "<tr><td><code>{}</code></td><td>{}</td><td>{:.3f}x [{:.3f}, {:.3f}]</td><td>{}</td>"
          "</tr>\n",
          esc(shown(c.route)), c.comparison.pairs, c.comparison.speedup(),
          c.comparison.speedupLow(), c.comparison.speedupHigh(),
          c.comparison.significantlyFaster() ? "yes" : "no");
    }
    h += "</table>\n";
  }
  h += "</body>\n</html>\n";
  return h;
}

}  // namespace kiln::tune
