// libFuzzer target: the safetensors reader (whole files and header-only).
// Every input must parse or raise tessel::Error: no crash, no hang, no other
// exception, no sanitizer report. Run by tools/fuzz.sh, outside ./tessel test.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "checkpoint/safetensors.h"
#include "runtime/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    tessel::checkpoint::parse_safetensors(bytes, "fuzz");
  } catch (const tessel::Error&) {
  }
  try {
    tessel::checkpoint::parse_safetensors_header(bytes, size, "fuzz");
  } catch (const tessel::Error&) {
  }
  return 0;
}
