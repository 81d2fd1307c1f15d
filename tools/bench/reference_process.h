#pragma once
// A benchmark's reference side (PyTorch, transformers) as a child process
// that answers one JSON line per command line on its stdin, so the two sides'
// rounds can alternate in one run (bench step, bench generate).
//
//   ReferenceProcess ref("bench step", {python, script, dir, "--threads", "2"});
//   nlohmann::json hello = ref.ask("");   // its first line, unprompted
//   nlohmann::json r = ref.ask("step");   // one round
//   // the destructor sends "quit", closes the pipes and waits for it
#include <sys/types.h>

#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessel::tools {

class ReferenceProcess {
 public:
  // Starts argv (argv[0] looked up in PATH); `op` names the bench in errors.
  ReferenceProcess(const std::string& op, const std::vector<std::string>& argv);
  ~ReferenceProcess();
  ReferenceProcess(const ReferenceProcess&) = delete;
  ReferenceProcess& operator=(const ReferenceProcess&) = delete;

  // Sends `cmd` (unless empty) and returns the next line parsed as JSON; a
  // discarded value when the child died or answered something else.
  nlohmann::json ask(const char* cmd);

 private:
  pid_t pid_ = -1;
  std::FILE* in_ = nullptr;
  std::FILE* out_ = nullptr;
};

}  // namespace tessel::tools
