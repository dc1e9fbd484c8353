// Reading a job script from disk, with the error every reader gives
// (ZD_ERR_IO naming the path and the reason).
#pragma once

#include <string>

namespace zerod::scripting {

std::string read_script_file(const std::string& path);

}  // namespace zerod::scripting
