// Helper for the crash tests (test_checkpoint_crash): saves ROOT/step-00000001
// completely, then saves ROOT/step-00000002 (values + 1) on a dp=2 x tp=2 mesh
// of threads and, when a writer reaches STAGE, prints "STAGE" and stops
// there until the test SIGKILLs the process.
//   ckpt_crash_helper ROOT STAGE [async]
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "autograd/api.h"
#include "checkpoint/manager.h"
#include "checkpoint/save.h"
#include "test/checkpoint/layouts.h"

using namespace tessel;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s ROOT STAGE [async]\n", argv[0]);
    return 2;
  }
  const std::string root = argv[1], stage = argv[2];
  const bool async = argc > 3 && std::strcmp(argv[3], "async") == 0;
  const auto& layout = testing::ckpt_layout("dp2xtp2");
  checkpoint::NamedTensors globals = testing::ckpt_tensors();
  testing::on_layout(layout, [&] {
    checkpoint::save(checkpoint::step_dir(root, 1), testing::lay_out(layout, globals, false), {{"step", 1}});
    return std::string();
  });
  std::printf("saved 1\n");
  std::fflush(stdout);
  for (auto& [name, t] : globals)
    if (t.is_floating_point() && t.numel() > 0) t = t + 1.0;
  std::once_flag once;
  checkpoint::SaveOptions opts;
  opts.on_stage = [&](const std::string& s) {
    if (s != stage) return;
    std::call_once(once, [&] {
      std::printf("%s\n", s.c_str());
      std::fflush(stdout);
    });
    for (;;) pause();  // until SIGKILL
  };
  testing::on_layout(layout, [&] {
    checkpoint::Saver saver;
    saver.save(checkpoint::step_dir(root, 2), testing::lay_out(layout, globals, false), {{"step", 2}}, async, opts);
    saver.wait();
    return std::string();
  });
  std::printf("saved 2\n");  // only when STAGE is never reached
  return 0;
}
