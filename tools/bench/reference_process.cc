#include "tools/bench/reference_process.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include "runtime/error.h"

namespace tessel::tools {

ReferenceProcess::ReferenceProcess(const std::string& op, const std::vector<std::string>& argv) {
  TESSEL_CHECK(!argv.empty(), op, "no command for the reference process");
  std::signal(SIGPIPE, SIG_IGN);  // a dead child must give an error, not kill us
  int to[2], from[2];
  TESSEL_CHECK(pipe(to) == 0 && pipe(from) == 0, op, "pipe failed: {}", std::strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, to[0], 0);
  posix_spawn_file_actions_adddup2(&fa, from[1], 1);
  for (int fd : {to[0], to[1], from[0], from[1]}) posix_spawn_file_actions_addclose(&fa, fd);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const int rc = posix_spawnp(&pid_, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(to[0]);
  close(from[1]);
  if (rc != 0) {
    close(to[1]);
    close(from[0]);
    TESSEL_FAIL(op, "cannot start '{}': {}", argv[0], std::strerror(rc));
  }
  in_ = fdopen(to[1], "w");
  out_ = fdopen(from[0], "r");
}

ReferenceProcess::~ReferenceProcess() {
  if (in_) {
    std::fputs("quit\n", in_);
    std::fclose(in_);
  }
  if (out_) std::fclose(out_);
  int status;
  waitpid(pid_, &status, 0);
}

nlohmann::json ReferenceProcess::ask(const char* cmd) {
  if (*cmd) {
    std::fputs(cmd, in_);
    std::fputc('\n', in_);
    std::fflush(in_);
  }
  std::string line;
  for (int c; (c = std::fgetc(out_)) != EOF && c != '\n';) line += char(c);
  return nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
}

}  // namespace tessel::tools
