// The subcommands of the zerod executable.
#pragma once

namespace zerod::cli {

// zerod check <job.lua | ds_config.json> [--allow-io] [--lr-steps N] [--world-size N] | --schema
int check_command(int argc, char** argv);
// zerod translate <ds_config.json> [--world-size N] | --keys
int translate_command(int argc, char** argv);
// zerod run --nproc N --job job.lua [--socket PATH] [--no-prefix] -- <trainer…>
int run_command(int argc, char** argv);
// zerod serve --nproc N --job job.lua --socket PATH
int serve_command(int argc, char** argv);
// zerod join --node K --nnodes N --rendezvous HOST:PORT --name NAME --uri-file PATH -- <command…>
int join_command(int argc, char** argv);
int ckpt_command(int argc, char** argv);
// zerod status [--socket PATH]
int status_command(int argc, char** argv);
// zerod top [--socket PATH] [--interval S] [--once]
int top_command(int argc, char** argv);
// zerod plot trace.json [--out DIR]: python3 -m zerod.plot
int plot_command(int argc, char** argv);
// zerod plan <job.lua> (--params N [--layers L] | --model FILE) [--nproc R] [--device D] [--device-memory SIZE]
// Exits 0 fits, 1 does not fit, 2 usage error, 3 cannot plan.
int plan_command(int argc, char** argv);

}  // namespace zerod::cli
