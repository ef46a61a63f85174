// The host-side check every CPU attention kernel makes of a ragged batch's block tables before it
// reads the cache through them.
#pragma once

#include <cstdint>
#include <string_view>

#include "edge/common/format.h"
#include "edge/common/status.h"

namespace edge::kernels::cpu {

// invalid_argument (naming `op`) unless token t's table (row seq[t] of table_begin into
// block_tables) reaches its position pos[t] and holds blocks of the cache only.
inline status check_block_table(std::string_view op, const std::int32_t* pos, const std::int32_t* seq,
                                const std::int32_t* block_tables, const std::int32_t* table_begin,
                                std::int64_t block_size, std::int64_t num_blocks, std::int64_t t) {
  const std::int64_t blocks_needed = (static_cast<std::int64_t>(pos[t]) + block_size) / block_size;
  const std::int32_t* row = table_begin + seq[t];
  if (pos[t] < 0 || blocks_needed > row[1] - row[0]) {
    return invalid_argument(format("{}: position {} beyond the block table", op, pos[t]));
  }
  const std::int32_t* table = block_tables + row[0];
  for (std::int64_t b = 0; b < blocks_needed; ++b) {
    if (table[b] < 0 || table[b] >= num_blocks) return invalid_argument(format("{}: block {} outside the cache", op, table[b]));
  }
  return {};
}

}  // namespace edge::kernels::cpu
