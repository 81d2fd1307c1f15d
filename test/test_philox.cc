// Philox4x32 known-answer tests (Random123's published vectors, kat_vectors)
// and the documented (seed, stream, element) -> bits mapping of runtime/philox.h.
#include <catch2/catch.hpp>

#include <set>

#include "autograd/api.h"
#include "runtime/philox.h"

using namespace tessel;

namespace {

struct Kat {
  Philox4 ctr;
  uint32_t k0, k1;
  Philox4 expect;
};

void check_kat(const Philox4& got, const Philox4& expect) {
  for (int i = 0; i < 4; ++i) {
    INFO("word " << i << std::hex << " got 0x" << got.v[i] << " expected 0x" << expect.v[i]);
    CHECK(got.v[i] == expect.v[i]);
  }
}

const Philox4 kZeros{{0, 0, 0, 0}};
const Philox4 kOnes{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}};
const Philox4 kPi{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}};

}  // namespace

TEST_CASE("philox4x32-10 matches Random123's known answers") {
  const Kat kats[] = {
      {kZeros, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {kOnes, 0xffffffffu, 0xffffffffu, {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {kPi, 0xa4093822u, 0x299f31d0u, {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  for (const Kat& k : kats) check_kat(philox::philox4x32<10>(k.ctr, k.k0, k.k1), k.expect);
}

TEST_CASE("philox4x32-7 matches Random123's known answers") {
  const Kat kats[] = {
      {kZeros, 0, 0, {{0x5f6fb709u, 0x0d893f64u, 0x4f121f81u, 0x4f730a48u}}},
      {kOnes, 0xffffffffu, 0xffffffffu, {{0x5207ddc2u, 0x45165e59u, 0x4d8ee751u, 0x8c52f662u}}},
      {kPi, 0xa4093822u, 0x299f31d0u, {{0x4dfccabau, 0x190a87f0u, 0xc47362bau, 0xb6b5242au}}},
  };
  for (const Kat& k : kats) check_kat(philox::philox4x32<7>(k.ctr, k.k0, k.k1), k.expect);
}

TEST_CASE("the key and counter layout is the documented one") {
  // key = {seed lo, seed hi}; counter = {block lo, block hi, stream lo, stream hi}.
  PhiloxKey key{0x299f31d0a4093822ull, 0x0370734413198a2eull};
  uint64_t b = 0x85a308d3243f6a88ull;
  check_kat(philox::block(key, b), {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}});
  // bits_at(e) = block(e / 4).v[e % 4].
  for (uint64_t e : {0ull, 1ull, 2ull, 3ull, 4ull, 1000003ull, (1ull << 40) + 7}) {
    CHECK(philox::bits_at(key, e) == philox::block(key, e / 4).v[e % 4]);
  }
}

TEST_CASE("uniform conversions: ranges and exact grids") {
  CHECK(philox::u01(0) == 0.0f);
  CHECK(philox::u01(0xffffffffu) < 1.0f);
  CHECK(philox::u01(0xffffffffu) == 1.0f - 5.9604644775390625e-8f);
  CHECK(philox::u01_open0(0) > 0.0f);
  CHECK(philox::u01_open0(0xffffffffu) == 1.0f);
  CHECK(philox::u01_double(0, 0) == 0.0);
  CHECK(philox::u01_double(0xffffffffu, 0xffffffffu) < 1.0);
  CHECK(philox::u01_double_open0(0xffffffffu, 0xffffffffu) == 1.0);
  CHECK(philox::bounded(0xffffffffu, 10) == 9);
  CHECK(philox::bounded(0, 10) == 0);
}

TEST_CASE("stream ids from names and counters") {
  uint64_t a = stream_for("layers.3.attn.wq.weight");
  CHECK(a == hash_string("layers.3.attn.wq.weight"));
  CHECK(a != stream_for("layers.3.attn.wk.weight"));
  CHECK(stream_for("dropout", {1, 2}) == combine_stream(combine_stream(hash_string("dropout"), 1), 2));
  CHECK(stream_for("dropout", {1, 2}) != stream_for("dropout", {2, 1}));
  CHECK(stream_for("dropout", {1}) != stream_for("dropout", {2}));
  std::set<uint64_t> seen;
  for (int layer = 0; layer < 64; ++layer)
    for (uint64_t step = 0; step < 16; ++step)
      seen.insert(stream_for("layers." + std::to_string(layer) + ".dropout", {step}));
  CHECK(seen.size() == 64 * 16);
  // Platform-independent constants: FNV-1a + splitmix64 of "" is fixed.
  CHECK(hash_string("") == mix64(0xcbf29ce484222325ull));
}
