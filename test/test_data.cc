// Corpus loading, the train/held-out split and the deterministic loader: the
// sample-index contract checked against Philox directly, and every split of
// the global batch into ranks and micro-batches checked bit for bit against
// the full batch.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <numeric>

#include "autograd/api.h"
#include "runtime/error.h"
#include "test/util/runfiles.h"
#include "test/util/util.h"
#include "train/data.h"

using namespace tessel;
using namespace tessel::train;
using tessel::testing::bitwise_equal;
using tessel::testing::data_path;

namespace {

// tokens[i] = i: every row of a batch reveals its start position.
TokenSpan iota_tokens(int64_t n) {
  auto v = std::make_shared<std::vector<int32_t>>(size_t(n));
  std::iota(v->begin(), v->end(), 0);
  return TokenSpan{v, 0, n};
}

std::string ends(const std::string& path) { return std::filesystem::path(path).filename().string(); }

}  // namespace

TEST_CASE("corpus files: a folder's text files by name, skipping .dat, .u8 and subfolders", "[data]") {
  auto files = corpus_files(data_path("corpus"));
  REQUIRE(files.size() == 2);
  CHECK(ends(files[0]) == "a.txt");
  CHECK(ends(files[1]) == "b.txt");
  CHECK(load_corpus_text(data_path("corpus")) ==
        "First file: the quick brown fox.\n%\nSecond file, UTF-8: caf\xc3\xa9.\n");
  // A single file is its own corpus.
  CHECK(corpus_files(data_path("corpus/b.txt")).size() == 1);

  Corpus c = load_corpus(data_path("corpus"), ByteTokenizer(), 10.0);
  CHECK(c.num_bytes == 35 + 27);
  REQUIRE(c.tokens->size() == 62);
  CHECK((*c.tokens)[0] == 'F');
  CHECK(c.split.heldout.size == 6);  // floor(62 * 0.1)
  CHECK(c.split.train.size == 56);
  CHECK(c.split.heldout.begin == 56);
  CHECK(c.split.heldout.data()[5] == '\n');
}

TEST_CASE("corpus errors name the path", "[data]") {
  CHECK_THROWS_WITH(corpus_files("/no/such/corpus"),
                    Catch::Contains("'/no/such/corpus' does not exist") && Catch::Contains("fortunes"));
  const std::string empty = tessel::testing::scratch_dir("empty_corpus");
  std::ofstream(empty + "/only.dat") << "x";
  CHECK_THROWS_WITH(corpus_files(empty), Catch::Contains("holds no text files") && Catch::Contains(empty));
}

TEST_CASE("split_tokens: the held-out part is the last N percent", "[data]") {
  auto v = std::make_shared<const std::vector<int32_t>>(1000, 7);
  TokenSplit s = split_tokens(v, 10);
  CHECK(s.train.begin == 0);
  CHECK(s.train.size == 900);
  CHECK(s.heldout.begin == 900);
  CHECK(s.heldout.size == 100);
  CHECK(split_tokens(v, 0).heldout.size == 0);
  CHECK(split_tokens(v, 2.5).heldout.size == 25);
  CHECK_THROWS_AS(split_tokens(v, 100), Error);
}

TEST_CASE("split_range: contiguous parts by ceil-division", "[data]") {
  CHECK(split_range(10, 3, 0).begin == 0);
  CHECK(split_range(10, 3, 0).end == 4);
  CHECK(split_range(10, 3, 1).begin == 4);
  CHECK(split_range(10, 3, 2).begin == 8);
  CHECK(split_range(10, 3, 2).end == 10);
  CHECK(split_range(2, 4, 3).size() == 0);  // more parts than items: empty tail parts
  CHECK(split_range(2, 4, 3).begin == 2);
}

TEST_CASE("loader: sample i of step s starts at bounded(philox(seed, stream_for(data, s)), i)", "[data]") {
  const int64_t N = 10000, T = 8, B = 12;
  const uint64_t seed = 42;
  DataLoader loader(iota_tokens(N), T, B, seed);
  for (int64_t step : {0, 1, 7, 123456}) {
    Batch b = loader.global_batch(step);
    REQUIRE(b.inputs.shape() == Dims{B, T});
    REQUIRE(b.targets.shape() == Dims{B, T});
    CHECK(b.inputs.dtype() == DType::Int64);
    CHECK(b.first_sample == 0);
    const PhiloxKey key{seed, stream_for("data", {uint64_t(step)})};
    auto in = b.inputs.to_vector<int64_t>(), tg = b.targets.to_vector<int64_t>();
    for (int64_t i = 0; i < B; ++i) {
      const int64_t start = philox::bounded(philox::bits_at(key, uint64_t(i)), uint32_t(N - T));
      for (int64_t t = 0; t < T; ++t) {
        REQUIRE(in[i * T + t] == start + t);
        REQUIRE(tg[i * T + t] == start + t + 1);
      }
    }
  }
  // Different steps and seeds draw different batches.
  CHECK_FALSE(bitwise_equal(loader.global_batch(1).inputs, loader.global_batch(2).inputs));
  DataLoader other(iota_tokens(N), T, B, seed + 1);
  CHECK_FALSE(bitwise_equal(loader.global_batch(1).inputs, other.global_batch(1).inputs));
  // The eval stream is independent of the training stream.
  DataLoader eval(iota_tokens(N), T, B, seed, "eval");
  CHECK_FALSE(bitwise_equal(loader.global_batch(1).inputs, eval.global_batch(1).inputs));
}

TEST_CASE("loader: any split into ranks and micro-batches is the slice of the full batch, bitwise", "[data]") {
  // Real token values (a tokenised text) rather than positions.
  std::string text;
  for (int i = 0; i < 200; ++i) text += "line " + std::to_string(i * 7919 % 1000) + " of the corpus\n";
  auto tok = std::make_shared<std::vector<int32_t>>(ByteTokenizer().encode(text));
  const TokenSpan span{tok, 0, int64_t(tok->size())};
  const int64_t T = 16, B = 12;
  DataLoader loader(span, T, B, 7);
  for (int64_t step : {0, 5}) {
    const Batch full = loader.global_batch(step);
    for (int64_t world : {1, 2, 3, 4, 5, 12, 16}) {
      for (int64_t micro : {1, 2, 3, 4}) {
        int64_t next_sample = 0;
        for (int64_t rank = 0; rank < world; ++rank) {
          for (int64_t m = 0; m < micro; ++m) {
            const Batch part = loader.micro_batch(step, m, micro, rank, world);
            INFO("step " << step << " world " << world << " micro " << micro << " rank " << rank << " m " << m);
            REQUIRE(part.first_sample == next_sample);  // contiguous, in order
            const int64_t n = part.size();
            REQUIRE(part.inputs.shape() == Dims{n, T});
            CHECK(bitwise_equal(part.inputs, full.inputs.narrow(0, part.first_sample, n)));
            CHECK(bitwise_equal(part.targets, full.targets.narrow(0, part.first_sample, n)));
            next_sample += n;
          }
        }
        CHECK(next_sample == B);  // the parts cover the batch exactly once
      }
    }
  }
  // samples() for an arbitrary range is that range of the full batch.
  CHECK(bitwise_equal(loader.samples(3, 5, 4).inputs, loader.global_batch(3).inputs.narrow(0, 5, 4)));
  CHECK_THROWS_WITH(loader.samples(3, 10, 4), Catch::Contains("outside the global batch of 12"));
}

TEST_CASE("loader: state (seed, step) round-trips through JSON and resumes bit for bit", "[data]") {
  DataLoader a(iota_tokens(5000), 8, 4, 99);
  std::vector<Batch> first;
  for (int i = 0; i < 3; ++i) first.push_back(a.next());
  CHECK(a.step() == 3);
  const std::string saved = a.state().to_json();
  CHECK(saved == R"({"seed":99,"step":3})");
  std::vector<Batch> more;
  for (int i = 0; i < 3; ++i) more.push_back(a.next());

  DataLoader b(iota_tokens(5000), 8, 4, 0);
  b.set_state(LoaderState::from_json(saved));
  CHECK(b.state() == LoaderState{99, 3});
  for (int i = 0; i < 3; ++i) CHECK(bitwise_equal(b.next().inputs, more[i].inputs));
  // next() is global_batch(step) (or this rank's part of it).
  CHECK(bitwise_equal(first[1].inputs, a.global_batch(1).inputs));
  DataLoader c(iota_tokens(5000), 8, 4, 99);
  Batch r1 = c.next(1, 2);
  CHECK(r1.first_sample == 2);
  CHECK(bitwise_equal(r1.inputs, first[0].inputs.narrow(0, 2, 2)));
  CHECK_THROWS_WITH(LoaderState::from_json("{\"seed\": 1}"), Catch::Contains("loader state"));
}

TEST_CASE("loader: a corpus shorter than seq_len + 1 is an error; exactly seq_len + 1 works", "[data]") {
  CHECK_THROWS_WITH(DataLoader(iota_tokens(8), 8, 2, 1),
                    Catch::Contains("8 tokens") && Catch::Contains("fewer than seq_len + 1 = 9"));
  DataLoader ok(iota_tokens(9), 8, 2, 1);
  Batch b = ok.global_batch(0);
  CHECK(b.inputs.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(b.targets.to_vector<int64_t>()[7] == 8);
  CHECK_THROWS_WITH(DataLoader(iota_tokens(100), 0, 2, 1), Catch::Contains("seq_len must be positive"));
  CHECK_THROWS_WITH(DataLoader(iota_tokens(100), 4, 0, 1), Catch::Contains("batch size must be positive"));
}

TEST_CASE("the default corpus (Debian fortunes) loads, skipping index files", "[data]") {
  if (!std::filesystem::is_directory(kDefaultCorpus)) {
    WARN("SKIPPED: " << kDefaultCorpus << " is not installed (tools/deps.sh installs 'fortunes')");
    return;
  }
  auto files = corpus_files(kDefaultCorpus);
  REQUIRE(files.size() > 10);
  CHECK(std::is_sorted(files.begin(), files.end()));
  int64_t bytes = 0;
  for (const auto& f : files) {
    const std::string ext = std::filesystem::path(f).extension().string();
    CHECK(ext != ".dat");
    CHECK(ext != ".u8");
    bytes += int64_t(std::filesystem::file_size(f));
  }
  Corpus c = load_corpus(kDefaultCorpus, ByteTokenizer(), 10.0);
  CHECK(c.num_bytes == bytes);
  CHECK(int64_t(c.tokens->size()) == bytes);
  CHECK(c.split.heldout.size == bytes / 10);
  DataLoader loader(c.split.train, 64, 8, 1);
  CHECK(loader.global_batch(0).inputs.shape() == Dims{8, 64});
  // The whole corpus (English, some Latin-1 bytes that are not UTF-8) round-trips
  // through the byte-level BPE of test/data.
  auto bpe = Gpt2BpeTokenizer::load(data_path("bpe_vocab.json"), data_path("bpe_merges.txt"));
  const std::string text = load_corpus_text(kDefaultCorpus);
  const std::vector<int32_t> ids = bpe->encode(text);
  CHECK(ids.size() < text.size());  // merges happened
  CHECK(bpe->decode(ids) == text);
}
