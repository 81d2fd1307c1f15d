#pragma once
// The C++ blocks each markdown file contributed to the build (the generated
// sources of tools/docs/snippets register themselves; docs_snippets_test
// checks the counts against the files).
#include <map>
#include <string>

namespace tessel::docs {

inline std::map<std::string, int>& snippet_registry() {
  static std::map<std::string, int> m;
  return m;
}

inline bool register_snippets(const std::string& file, int blocks) {
  snippet_registry()[file] = blocks;
  return true;
}

}  // namespace tessel::docs
