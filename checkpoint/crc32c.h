#pragma once
// CRC-32C (Castagnoli), the checksum of checkpoint files: hardware-accelerated
// (SSE4.2 crc32 instruction, ~8 bytes per 3 cycles) where the CPU has it, a
// table otherwise; both give the same values (tested).
//
// Conventions are the usual ones (iSCSI, leveldb, ext4): initial value and
// final xor 0xffffffff, reflected, so crc32c("123456789") == 0xe3069283.
#include <cstddef>
#include <cstdint>

namespace tessel::checkpoint {

// The CRC of `data`, continuing from the CRC of preceding bytes (`crc` = 0
// for none): crc32c_extend(crc32c(a), b) == crc32c(a + b).
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);
inline uint32_t crc32c(const void* data, size_t n) { return crc32c_extend(0, data, n); }

// crc32c(a + b) from crc32c(a), crc32c(b) and len(b), in O(log len(b)):
// a file's CRC is assembled from the CRCs of its blocks without reading it twice.
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

namespace detail {
// The table implementation alone (tests compare it with the hardware path).
uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t n);
}  // namespace detail

}  // namespace tessel::checkpoint
