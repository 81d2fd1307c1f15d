// The SVG loss curve: well-formed markup (checked by a small tag parser), one
// polyline point per finite train loss, one circle per eval loss, ticks,
// labels and title; written atomically.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "test/util/runfiles.h"
#include "train/plot.h"

using namespace tessel::train;

namespace {

struct Element {
  std::string name;
  std::map<std::string, std::string> attrs;
  std::string text;  // text directly inside (for <text>)
};

// A strict-enough XML reader for our SVG: checks that tags nest and close,
// attributes are quoted and unique, and returns every element.
std::vector<Element> parse_xml(const std::string& s) {
  std::vector<Element> out;
  std::vector<std::pair<std::string, size_t>> open;  // name, index in out
  size_t i = 0;
  auto fail = [&](const std::string& why) { throw std::runtime_error(why + " at offset " + std::to_string(i)); };
  while (i < s.size()) {
    if (s[i] != '<') {
      const size_t j = s.find('<', i);
      const std::string text = s.substr(i, j - i);
      if (text.find('>') != std::string::npos) fail("stray '>'");
      if (!open.empty()) out[open.back().second].text += text;
      else if (text.find_first_not_of(" \n") != std::string::npos) fail("text outside the root");
      i = j == std::string::npos ? s.size() : j;
      continue;
    }
    if (s.compare(i, 5, "<?xml") == 0) {
      const size_t j = s.find("?>", i);
      if (j == std::string::npos || i != 0) fail("bad XML declaration");
      i = j + 2;
      continue;
    }
    if (s.compare(i, 2, "</") == 0) {
      const size_t j = s.find('>', i);
      const std::string name = s.substr(i + 2, j - i - 2);
      if (open.empty() || open.back().first != name) fail("mismatched </" + name + ">");
      open.pop_back();
      i = j + 1;
      continue;
    }
    // <name attr="v" ...> or <name .../>
    size_t j = i + 1;
    while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '-')) ++j;
    Element e;
    e.name = s.substr(i + 1, j - i - 1);
    if (e.name.empty()) fail("empty tag name");
    if (open.empty() && !out.empty()) fail("second root element");
    bool self_closing = false;
    for (;;) {
      while (s[j] == ' ' || s[j] == '\n') ++j;
      if (s[j] == '>') break;
      if (s.compare(j, 2, "/>") == 0) {
        self_closing = true;
        ++j;
        break;
      }
      const size_t eq = s.find('=', j);
      const std::string key = s.substr(j, eq - j);
      if (key.empty() || key.find_first_of(" <>\"") != std::string::npos) fail("bad attribute name '" + key + "'");
      if (s[eq + 1] != '"') fail("unquoted attribute " + key);
      const size_t close = s.find('"', eq + 2);
      const std::string value = s.substr(eq + 2, close - eq - 2);
      if (value.find('<') != std::string::npos) fail("'<' in attribute " + key);
      if (!e.attrs.emplace(key, value).second) fail("duplicate attribute " + key);
      j = close + 1;
    }
    out.push_back(e);
    if (!self_closing) open.emplace_back(e.name, out.size() - 1);
    i = j + 1;
  }
  if (!open.empty()) throw std::runtime_error("unclosed <" + open.back().first + ">");
  return out;
}

std::vector<const Element*> with_class(const std::vector<Element>& els, const std::string& name,
                                       const std::string& cls) {
  std::vector<const Element*> r;
  for (const auto& e : els) {
    auto it = e.attrs.find("class");
    if (e.name == name && it != e.attrs.end() && it->second == cls) r.push_back(&e);
  }
  return r;
}

std::vector<StepMetrics> fake_run(int steps, int eval_every) {
  std::vector<StepMetrics> recs;
  for (int s = 1; s <= steps; ++s) {
    StepMetrics m;
    m.step = s;
    m.loss = s == 17 ? NAN : 5.0 * std::exp(-s / 20.0) + 1.0;  // one diverged step
    if (s % eval_every == 0) m.extras = {{"eval_loss", 5.2 * std::exp(-s / 20.0) + 1.1}};
    recs.push_back(m);
  }
  return recs;
}

}  // namespace

TEST_CASE("nice_ticks: 1-2-5 steps covering the range", "[plot]") {
  auto t = nice_ticks(0, 1);
  REQUIRE(t.size() == 6);
  for (int i = 0; i < 6; ++i) CHECK(t[i] == Approx(0.2 * i));
  CHECK(nice_ticks(0, 1000) == std::vector<double>{0, 200, 400, 600, 800, 1000});
  CHECK(nice_ticks(1, 50) == std::vector<double>{10, 20, 30, 40, 50});
  CHECK(nice_ticks(2.3, 2.3) == std::vector<double>{2.3});
}

TEST_CASE("loss_series takes finite train losses and eval points", "[plot]") {
  LossSeries s = loss_series(fake_run(50, 10));
  CHECK(s.train.size() == 49);  // step 17 is NaN
  REQUIRE(s.eval.size() == 5);
  CHECK(s.eval[0].first == 10);
  CHECK(s.eval[4].first == 50);
}

TEST_CASE("the SVG is well-formed with one point per train loss and one circle per eval loss", "[plot]") {
  PlotOptions opts;
  opts.title = "tiny <run> & co";
  const std::string svg = loss_curve_svg(loss_series(fake_run(50, 10)), opts);
  std::vector<Element> els;
  REQUIRE_NOTHROW(els = parse_xml(svg));
  REQUIRE(!els.empty());
  CHECK(els[0].name == "svg");
  CHECK(els[0].attrs.at("xmlns") == "http://www.w3.org/2000/svg");
  CHECK(els[0].attrs.at("width") == "800");

  auto lines = with_class(els, "polyline", "train-loss");
  REQUIRE(lines.size() == 1);
  std::istringstream pts(lines[0]->attrs.at("points"));
  std::string pt;
  int n = 0;
  double prev_x = -1, first_y = 0, last_y = 0;
  while (pts >> pt) {
    double x, y;
    char comma;
    std::istringstream(pt) >> x >> comma >> y;
    CHECK(comma == ',');
    CHECK(x > prev_x);  // steps increase left to right
    CHECK((x >= 0 && x <= 800 && y >= 0 && y <= 480));
    if (n == 0) first_y = y;
    last_y = y;
    prev_x = x;
    ++n;
  }
  CHECK(n == 49);
  // The loss decreases: the last point is lower on the page (larger y) than the first.
  CHECK(last_y > first_y);
  CHECK(with_class(els, "circle", "eval-loss").size() == 5);

  auto titles = with_class(els, "text", "title");
  REQUIRE(titles.size() == 1);
  CHECK(titles[0]->text == "tiny &lt;run&gt; &amp; co");
  auto axis = with_class(els, "text", "axis-label");
  REQUIRE(axis.size() == 2);
  CHECK(axis[0]->text == "step");
  CHECK(axis[1]->text == "loss");
  auto labels = with_class(els, "text", "tick-label");
  CHECK(labels.size() >= 6);
  CHECK(with_class(els, "line", "tick").size() == labels.size());
  bool has_50 = false;
  for (auto* l : labels) has_50 |= l->text == "50";
  CHECK(has_50);  // the last step is a tick of the x axis
}

TEST_CASE("degenerate inputs still give a valid plot", "[plot]") {
  for (const LossSeries& s : {LossSeries{}, LossSeries{{{1, 2.0}}, {}}, LossSeries{{}, {{5, 1.0}, {5, 1.0}}}}) {
    const std::string svg = loss_curve_svg(s);
    std::vector<Element> els;
    REQUIRE_NOTHROW(els = parse_xml(svg));
    CHECK(with_class(els, "polyline", "train-loss").size() == (s.train.empty() ? 0u : 1u));
    CHECK(with_class(els, "circle", "eval-loss").size() == s.eval.size());
    CHECK(svg.find("nan") == std::string::npos);
    CHECK(svg.find("inf") == std::string::npos);
  }
}

TEST_CASE("write_loss_curve_svg writes atomically", "[plot]") {
  const std::string dir = tessel::testing::scratch_dir("plot");
  const std::string path = dir + "/loss.svg";
  const LossSeries s = loss_series(fake_run(20, 5));
  write_loss_curve_svg(path, s);
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  CHECK(ss.str() == loss_curve_svg(s));
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
}
