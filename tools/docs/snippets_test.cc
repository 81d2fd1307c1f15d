// Every C++ block of README.md and docs/*.md is compiled by the build
// (docs/BUILD, tools/docs/snippets.cc). This test checks that the generated
// sources saw every block: per file, the ```cpp fences minus those marked
// `<!-- not compiled: reason -->` equal what the generated source registered.
#include <catch2/catch.hpp>

#include <fstream>
#include <string>

#include "tools/docs/registry.h"

TEST_CASE("every C++ block of the docs was compiled") {
  const auto& reg = tessel::docs::snippet_registry();
  REQUIRE(reg.size() >= 2);
  int total = 0;
  for (const auto& [file, count] : reg) {
    INFO(file);
    std::ifstream in(file);
    REQUIRE(in.good());
    std::string line, prev;
    int fences = 0, excluded = 0;
    bool inside = false;
    while (std::getline(in, line)) {
      if (!inside && (line.rfind("```cpp", 0) == 0 || line.rfind("```c++", 0) == 0)) {
        inside = true;
        ++fences;
        if (prev.rfind("<!-- not compiled:", 0) == 0) ++excluded;
      } else if (inside && line.rfind("```", 0) == 0) {
        inside = false;
      }
      if (!line.empty()) prev = line;
    }
    CHECK(count == fences - excluded);
    total += count;
  }
  bool readme = false;
  for (const auto& [file, count] : reg) readme = readme || (file.size() >= 9 && file.compare(file.size() - 9, 9, "README.md") == 0);
  CHECK(readme);
  CHECK(total >= 8);
}
