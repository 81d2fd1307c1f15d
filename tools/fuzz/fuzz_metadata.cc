// libFuzzer target: the distributed checkpoint's metadata.json reader.
// Every input must parse or raise tessel::Error. When it parses, the result
// must satisfy what readers rely on (chunks tile each tensor, lie inside
// their files) and survive a write/read round trip unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "checkpoint/metadata.h"
#include "runtime/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  tessel::checkpoint::CheckpointMeta m;
  try {
    m = tessel::checkpoint::parse_metadata(text, "fuzz");
  } catch (const tessel::Error&) {
    return 0;
  }
  for (const auto& t : m.tensors)
    for (const auto& c : t.chunks) {
      const auto& f = m.files[size_t(c.file)];
      if (c.begin + tessel::checkpoint::chunk_bytes(c, t.dtype) > f.bytes) std::abort();
    }
  const std::string again = tessel::checkpoint::metadata_to_json(m);
  if (tessel::checkpoint::metadata_to_json(tessel::checkpoint::parse_metadata(again, "fuzz")) != again) std::abort();
  return 0;
}
