// The subcommands of the zerod executable.
#pragma once

namespace zerod::cli {

// zerod check <job.lua> [--allow-io] [--lr-steps N]
int check_command(int argc, char** argv);

}  // namespace zerod::cli
