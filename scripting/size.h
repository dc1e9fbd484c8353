// Size literals in job scripts: 4096, "512MiB", "1.5 GiB", "4GB".
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace zerod::scripting {

// Binary units (KiB, MiB, GiB, TiB), decimal units (KB, MB, GB, TB) and B.
// nullopt for anything else, including negative sizes and bare "M" or "G",
// which could mean either.
std::optional<uint64_t> parse_size(const std::string& text);

}  // namespace zerod::scripting
