// `tessel ckpt`: look at and convert checkpoints (docs/checkpoint.md).
//   tessel ckpt inspect DIR [--verify]        tensors, layouts, chunks, files, sizes, state
//   tessel ckpt verify DIR                    read every byte, check every checksum
//   tessel ckpt convert --to hf SRC DST [--max-shard-bytes N]
//                                             a training checkpoint's model -> HF-named safetensors + config.json
//   tessel ckpt convert --to tessel SRC DST   an HF folder -> a tessel checkpoint (tensors "model.<path>")
// DIR may also be a run's checkpoints folder (step-N inside) or the run folder: its newest complete checkpoint is used.
#include <cstdio>
#include <map>

#include "autograd/api.h"
#include "checkpoint/hf.h"
#include "checkpoint/load.h"
#include "checkpoint/manager.h"
#include "checkpoint/model_config.h"
#include "checkpoint/save.h"
#include "tools/cli/commands.h"

namespace tessel::cli {
namespace {

std::string resolve(const std::string& dir) {
  if (checkpoint::io::exists(dir + "/" + checkpoint::kMetadataFile)) return dir;
  for (const std::string& root : {dir, dir + "/checkpoints"}) {  // a checkpoints folder, or a run folder
    if (auto latest = checkpoint::latest_checkpoint(root)) {
      std::printf("%s: newest complete checkpoint %s\n", dir.c_str(), latest->path.c_str());
      return latest->path;
    }
  }
  return dir;  // the reader's error says what is missing
}

std::string human(uint64_t b) {
  if (b >= (uint64_t(1) << 30)) return fmt::format(FMT_STRING("{:.2f} GiB"), double(b) / double(uint64_t(1) << 30));
  if (b >= (uint64_t(1) << 20)) return fmt::format(FMT_STRING("{:.2f} MiB"), double(b) / double(1 << 20));
  if (b >= 1024) return fmt::format(FMT_STRING("{:.1f} KiB"), double(b) / 1024.0);
  return fmt::format(FMT_STRING("{} B"), b);
}

int inspect(const std::string& dir_in, bool verify) {
  const std::string dir = resolve(dir_in);
  checkpoint::CheckpointReader reader(dir);
  const checkpoint::CheckpointMeta& m = reader.meta();
  std::printf("checkpoint %s: format v%d, saved by %d rank(s), CRC32C per %s block\n", dir.c_str(), m.version,
              m.world_size, human(m.block_bytes).c_str());
  std::printf("state: %s\n\n", m.state.dump().c_str());
  size_t w = 6;
  for (const auto& t : m.tensors) w = std::max(w, t.name.size());
  std::printf("%-*s  %-5s  %-18s  %-28s  %6s  %10s\n", int(w), "tensor", "dtype", "shape", "saved layout", "chunks",
              "bytes");
  for (const auto& t : m.tensors)
    std::printf("%-*s  %-5s  %-18s  %-28s  %6zu  %10s\n", int(w), t.name.c_str(),
                checkpoint::safetensors_dtype_name(t.dtype), t.shape.str().c_str(), t.layout.c_str(),
                t.chunks.size(), human(t.nbytes()).c_str());
  std::printf("\n%-28s  %5s  %12s  %8s\n", "file", "rank", "bytes", "crc32c");
  for (const auto& f : m.files)
    std::printf("%-28s  %5d  %12s  %08x\n", f.name.c_str(), f.rank, human(f.bytes).c_str(), f.crc);
  std::printf("\n%zu tensors, %s of tensor data in %zu files of %s (replicas written once)\n", m.tensors.size(),
              human(m.total_tensor_bytes()).c_str(), m.files.size(), human(m.total_file_bytes()).c_str());
  if (verify) {
    reader.verify_all();
    std::printf("verified: every byte read, every checksum matches\n");
  }
  return 0;
}

int to_hf(const std::string& src, const std::string& dst, uint64_t shard_bytes) {
  const std::string dir = resolve(src);
  checkpoint::CheckpointReader reader(dir);
  const auto& state = reader.meta().state;
  TESSEL_CHECK(state.contains("model"), "ckpt convert",
               "'{}' records no model config (state.model); save it with `tessel train --ckpt-every N`", dir);
  const models::ModelConfig mc = checkpoint::model_config_from_json(state["model"]);
  checkpoint::NamedTensors params;
  for (const auto& t : reader.meta().tensors)
    if (t.name.rfind("model.", 0) == 0) params.emplace_back(t.name.substr(6), checkpoint::read_tensor(reader, t.name));
  checkpoint::save_hf(dst, mc, checkpoint::to_hf(mc, params), shard_bytes);
  std::printf("wrote %s: %s as Hugging Face %s (%zu tensors)\n", dst.c_str(),
              mc.describe().c_str(), checkpoint::hf_config_json(mc)["model_type"].get<std::string>().c_str(),
              params.size());
  return 0;
}

int to_tessel(const std::string& src, const std::string& dst) {
  const models::ModelConfig mc = checkpoint::model_config_from_hf(checkpoint::load_hf_config(src));
  checkpoint::NamedTensors out;
  for (auto& [name, t] : checkpoint::from_hf(mc, checkpoint::load_hf_tensors(src)))
    out.emplace_back("model." + name, t.to(DType::Float32).contiguous());  // tessel keeps float32 master weights
  checkpoint::save(dst, out, {{"step", 0}, {"model", checkpoint::model_config_to_json(mc)}, {"source", src}});
  std::printf("wrote %s: %s from %s (%zu tensors)\n", dst.c_str(),
              mc.describe().c_str(), src.c_str(), out.size());
  return 0;
}

}  // namespace

void register_ckpt(CLI::App& app) {
  CLI::App* ckpt = app.add_subcommand("ckpt", "Inspect, verify and convert checkpoints (tessel and Hugging Face)");
  ckpt->require_subcommand(1);
  static std::string dir, src, dst, to = "hf";
  static bool verify = false;
  static uint64_t shard_bytes = uint64_t(5) << 30;
  CLI::App* in = add_command(*ckpt, "inspect", "tensors, layouts, chunks, files and sizes of a checkpoint",
                             [] { return inspect(dir, verify); });
  in->add_option("dir", dir, "checkpoint directory (or a run's checkpoints folder)")->required();
  in->add_flag("--verify", verify, "also read every byte and check every checksum");
  CLI::App* ve = add_command(*ckpt, "verify", "read every byte of a checkpoint and check every checksum",
                             [] { return inspect(dir, true); });
  ve->add_option("dir", dir)->required();
  CLI::App* cv = add_command(*ckpt, "convert", "between tessel checkpoints and Hugging Face safetensors", [] {
    return to == "hf" ? to_hf(src, dst, shard_bytes) : to_tessel(src, dst);
  });
  cv->add_option("--to", to, "hf: tessel checkpoint -> HF folder; tessel: HF folder -> tessel checkpoint")
      ->check(CLI::IsMember({"hf", "tessel"}));
  cv->add_option("src", src)->required();
  cv->add_option("dst", dst)->required();
  cv->add_option("--max-shard-bytes", shard_bytes, "largest HF safetensors shard (default 5 GiB)");
}

}  // namespace tessel::cli
