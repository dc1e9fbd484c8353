// `zerod ckpt`: checkpoints on disk (docs/checkpoints.md).
//   zerod ckpt info DIR [--verify] [--tag TAG] [--threads N]
//   zerod ckpt export DIR --to model.safetensors [--dtype fp32|bf16|fp16] [--max-shard-size 5GiB] [--threads N]
//   zerod ckpt reshard DIR --world M --to OUT [--threads N]
//   zerod ckpt import DEEPSPEED_DIR --to OUT   (a DeepSpeed ZeRO checkpoint; Python with torch and deepspeed)
// DIR is a checkpoint, or a folder of them that save_checkpoint filled
// (DeepSpeed's convention): the tag its `latest` file names is read, and
// said; --tag TAG reads DIR/TAG instead.
#include "commands.h"
#include "cli_args.h"
#include "zerod_python.h"

#include "checkpoint/source.h"
#include "checkpoint/tools.h"
#include "error.h"
#include "memory/ledger.h"
#include "runtime/dtype.h"
#include "size.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace zerod::cli {

namespace {

// Each command's usage lines; `zerod ckpt --help` prints them all, `zerod
// ckpt CMD --help` its own.
struct CommandUsage {
  const char* name;
  const char* text;
  const char* options;  // the options it takes: one given to another command is refused, not ignored
};
constexpr CommandUsage kCommands[] = {
    {"info", "  info DIR [--verify] [--tag TAG]      what the checkpoint holds; --verify checks every record\n"
             "      [--threads N]\n",
     "--verify --tag --threads"},
    {"export",
     "  export DIR --to FILE.safetensors     the parameters, whole, as safetensors\n"
     "      [--dtype fp32|bf16|fp16] [--max-shard-size SIZE] [--threads N] [--tag TAG]\n",
     "--to --dtype --max-shard-size --threads --tag"},
    {"reshard",
     "  reshard DIR --world M --to OUT       the checkpoint again as M shards (any checkpoint loads at any\n"
     "      [--threads N] [--tag TAG]        world size as it is; this spreads its files for M ranks)\n",
     "--world --to --threads --tag"},
    {"import",
     "  import DS_DIR --to OUT               a DeepSpeed ZeRO checkpoint (stages 1-3) as a zerod one\n"
     "      [--tag TAG]                      (needs Python with torch and deepspeed)\n",
     "--to --tag"},
};

// Whether `option` is one of `options` (a space-separated list).
bool listed(const std::string& options, const std::string& option) {
  for (size_t at = 0; at <= options.size();) {
    const size_t end = std::min(options.find(' ', at), options.size());
    if (options.compare(at, end - at, option) == 0) return true;
    at = end + 1;
  }
  return false;
}

// Whether some ckpt command takes `option`.
bool any_command_takes(const std::string& option) {
  for (const auto& c : kCommands)
    if (listed(c.options, option)) return true;
  return false;
}

const CommandUsage* find_command(const std::string& name) {
  for (const auto& c : kCommands)
    if (name == c.name) return &c;
  return nullptr;
}

bool is_help(const std::string& a) { return a == "-h" || a == "--help"; }

// All the commands, or only `only`'s.
void usage(FILE* out, const CommandUsage* only = nullptr) {
  std::fprintf(out, "usage: zerod ckpt %s DIR [options]\n", only ? only->name : "<command>");
  std::fprintf(out, "  DIR: a checkpoint, or a folder of them with a 'latest' file (as save_checkpoint writes: the tag\n"
                    "  it names is read; --tag TAG reads DIR/TAG instead)\n");
  for (const auto& c : kCommands)
    if (!only || only == &c) std::fputs(c.text, out);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

uint64_t disk_bytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.is_regular_file(ec)) total += e.file_size(ec);
  return total;
}

// Makes `folder` and the folders above it that are not there, one at a time
// as written (so "new/../x" makes "new" only), and unless keep() is called
// removes, deepest first, those it made that are still empty. Throws Error.
class MadeDirectories {
 public:
  explicit MadeDirectories(const std::filesystem::path& folder) {
    std::filesystem::path at;
    for (const auto& part : folder) {
      at /= part;
      std::error_code ec;
      if (std::filesystem::exists(at, ec)) continue;
      const bool created = std::filesystem::create_directory(at, ec);
      if (ec) fail(ZD_ERR_IO, "cannot make the directory " + at.string() + ": " + ec.message());
      if (created) made_.push_back(at);  // not one another process made meanwhile
    }
  }
  MadeDirectories(const MadeDirectories&) = delete;
  MadeDirectories& operator=(const MadeDirectories&) = delete;
  ~MadeDirectories() {
    std::error_code ec;
    for (auto it = made_.rbegin(); it != made_.rend(); ++it) std::filesystem::remove(*it, ec);
  }
  void keep() { made_.clear(); }

 private:
  std::vector<std::filesystem::path> made_;
};

int info(const std::string& dir, bool verify, unsigned threads) {
  const ckpt::Source src(dir);
  const ckpt::Manifest& m = src.manifest();
  uint64_t numel = 0;
  for (const auto& p : m.params) numel += p.numel;
  std::printf("%s: zerod checkpoint (format %d)\n  step %lld, written by %d rank%s at ZeRO stage %d, precision %s\n"
              "  %zu parameters, %llu elements; optimizer %s (",
              dir.c_str(), m.version, static_cast<long long>(m.step), m.world_size, m.world_size == 1 ? "" : "s",
              m.zero_stage, m.precision.c_str(), m.params.size(), static_cast<unsigned long long>(numel),
              m.optimizer.c_str());
  for (size_t i = 0; i < m.slots.size(); ++i) std::printf("%s%s", i ? ", " : "", m.slots[i].c_str());
  std::printf("); loss scale %g", m.loss_scale);
  if (m.lr) std::printf("; lr %.9g, which the trainer set (zd_model_set_lr)", *m.lr);
  std::printf("\n  %s on disk\n", format_bytes(disk_bytes(dir)).c_str());
  std::fputs(ckpt::held_beyond_slots(m).c_str(), stdout);
  if (m.nodes > 0) {
    std::printf("  a snapshot across %d nodes, %s:\n", m.nodes,
                m.shared ? "in one directory every node saw" : "each node's part on its own disk");
    for (const auto& p : m.parts)
      std::printf("    node %d (host %s): ranks %d..%d\n", p.node, p.host.c_str(), p.first_rank,
                  p.first_rank + p.ranks - 1);
  }
  if (verify) {
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t n = ckpt::verify_all(src, threads);
    std::printf("  verified: every value of %llu parameter buffers is there and passes its checksum (%.1f s)\n",
                static_cast<unsigned long long>(n), seconds_since(t0));
  }
  return 0;
}

// Whether `python` finds torch and deepspeed (found, not imported: importing
// deepspeed takes seconds). Quiet: a Python that is not there is a "no".
bool finds_torch_and_deepspeed(const std::string& python) {
  std::vector<std::string> argv = {python, "-c",
                                   "import importlib.util as u, sys; "
                                   "sys.exit(0 if u.find_spec('torch') and u.find_spec('deepspeed') else 1)"};
  std::vector<char*> c;
  for (auto& a : argv) c.push_back(a.data());
  c.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) {
      ::dup2(null, STDOUT_FILENO);
      ::dup2(null, STDERR_FILENO);
    }
    execvp(c[0], c.data());
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// The Python the import runs: ZEROD_PYTHON when set; else, as `zerod plot`
// chooses, Debian's /usr/bin/python3 first, then python3 on PATH (a venv's,
// where pip put deepspeed), the first that has torch and deepspeed. "" when
// neither has them.
std::string import_python() {
  const char* py = std::getenv("ZEROD_PYTHON");
  if (py && *py) return py;
  struct stat st;
  for (const char* candidate : {"/usr/bin/python3", "python3"})
    if ((candidate[0] != '/' || ::stat(candidate, &st) == 0) && finds_torch_and_deepspeed(candidate)) return candidate;
  return "";
}

// `import`: DeepSpeed's files are torch pickles, read in Python (zerod.ckpt
// extract-deepspeed, through DeepSpeed's own converter) into raw fp32 files;
// the checkpoint is written from those here.
int import_deepspeed(const std::vector<std::string>& args) {
  std::string ds_dir, to, tag;
  for (size_t i = 0; i < args.size(); ++i) {
    if (is_help(args[i])) {
      usage(stdout, find_command("import"));
      return 0;
    }
    if (args[i] == "--to" && i + 1 < args.size()) to = args[++i];
    else if (args[i] == "--tag" && i + 1 < args.size()) tag = args[++i];
    else if (ds_dir.empty() && args[i][0] != '-') ds_dir = args[i];
    else {
      std::fprintf(stderr, "zerod ckpt import: unexpected argument '%s'\n", args[i].c_str());
      return 2;
    }
  }
  if (ds_dir.empty() || to.empty()) {
    std::fprintf(stderr, "zerod ckpt import: DEEPSPEED_DIR and --to OUT are required\n");
    return 2;
  }
  // A checkpoint that is not there is found before Python starts (torch
  // takes seconds to import), and said as the other commands say it.
  std::error_code ec;
  if (!std::filesystem::is_directory(ds_dir, ec)) {
    std::fprintf(stderr, "zerod ckpt import: no DeepSpeed checkpoint at %s: it is not a directory (ZD_ERR_IO)\n",
                 ds_dir.c_str());
    return 1;
  }
  // DeepSpeed's folder convention, as for the other commands: the tag its
  // latest names, said here (the Python side reads the tag it is given).
  try {
    bool files_here = false;
    for (const auto& e : std::filesystem::directory_iterator(ds_dir, ec))
      files_here = files_here || e.path().filename().string().ends_with("_model_states.pt");
    const bool from_latest = tag.empty() && !files_here;
    if (from_latest) tag = ckpt::latest_tag(ds_dir);
    if (!tag.empty() && !std::filesystem::is_directory(std::filesystem::path(ds_dir) / tag, ec))
      fail(ZD_ERR_IO, "no DeepSpeed checkpoint at " + ds_dir + ": " +
                          (from_latest ? "its 'latest' file names '" + tag + "', but " : std::string("--tag: ")) +
                          ds_dir + "/" + tag + " is not a directory");
    if (!tag.empty())
      std::printf("%s: %s %s: reading %s/%s\n", ds_dir.c_str(), from_latest ? "its 'latest' file names" : "--tag",
                  tag.c_str(), ds_dir.c_str(), tag.c_str());
    std::fflush(stdout);
  } catch (const Error& e) {
    std::fprintf(stderr, "zerod ckpt import: %s (%s)\n", e.what(), status_name(e.code()));
    return 1;
  }
  const std::string python = import_python();
  if (python.empty()) {
    std::fprintf(stderr, "zerod ckpt import: the import reads DeepSpeed's torch files and needs Python with torch and "
                         "deepspeed; neither /usr/bin/python3 nor python3 on PATH has them: set ZEROD_PYTHON to one\n");
    return 1;
  }
  // The zerod package beside this binary (the build tree's bindings/python).
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::string path = std::getenv("PYTHONPATH") ? std::getenv("PYTHONPATH") : "";
  const auto tree = self.parent_path().parent_path().parent_path() / "bindings" / "python";
  if (std::filesystem::exists(tree / "zerod" / "ckpt.py", ec)) path = tree.string() + (path.empty() ? "" : ":" + path);
  char tmpl[] = "/tmp/zerod-import-XXXXXX";
  if (!mkdtemp(tmpl)) {
    std::fprintf(stderr, "zerod ckpt import: mkdtemp: %s\n", std::strerror(errno));
    return 1;
  }
  const std::string raw = tmpl;
  struct Remove {
    std::string dir;
    ~Remove() {
      std::error_code e;
      std::filesystem::remove_all(dir, e);
    }
  } remove{raw};
  std::vector<std::string> argv = {python, "-m", "zerod.ckpt", "extract-deepspeed", ds_dir, "--to", raw};
  if (!tag.empty()) argv.insert(argv.end(), {"--tag", tag});
  // `import zerod` in that Python loads the libzerod beside this zerod.
  point_zerod_lib_at_this_install();
  const pid_t pid = fork();
  if (pid == 0) {
    if (!path.empty()) setenv("PYTHONPATH", path.c_str(), 1);
    std::vector<char*> c;
    for (auto& a : argv) c.push_back(a.data());
    c.push_back(nullptr);
    execvp(c[0], c.data());
    std::fprintf(stderr, "zerod ckpt import: cannot run %s (%s): the import reads DeepSpeed's torch files and needs "
                         "Python with torch and deepspeed; set ZEROD_PYTHON to one\n",
                 python.c_str(), std::strerror(errno));
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "zerod ckpt import: reading the DeepSpeed checkpoint with %s failed (see above; where that "
                         "Python lacks torch or deepspeed, set ZEROD_PYTHON to one that has them); nothing was "
                         "written\n", python.c_str());
    return 1;
  }
  try {
    const auto t0 = std::chrono::steady_clock::now();
    const ckpt::Manifest m = ckpt::import_raw(raw, to);
    // The buffers and client state beside the zerod state, when the source
    // had any: a copy that fails is an import that fails, not one said done.
    if (std::filesystem::exists(raw + "/torch_state.pt", ec)) {
      const std::string tmp = to + "/torch_state.pt.tmp";
      std::filesystem::copy_file(raw + "/torch_state.pt", tmp, std::filesystem::copy_options::overwrite_existing, ec);
      if (!ec) std::filesystem::rename(tmp, to + "/torch_state.pt", ec);
      if (ec) {
        std::error_code ignored;
        std::filesystem::remove(tmp, ignored);
        fail(ZD_ERR_IO, "copying torch_state.pt (the buffers and client state) into " + to + ": " + ec.message() +
                            "; the zerod state itself was imported");
      }
    }
    std::printf("imported %zu parameters of step %lld (DeepSpeed ZeRO stage %d, %s) into %s in %.1f s\n",
                m.params.size(), static_cast<long long>(m.step), m.zero_stage, m.optimizer.c_str(), to.c_str(),
                seconds_since(t0));
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "zerod ckpt import: %s (%s)\n", e.what(), status_name(e.code()));
    return 1;
  }
}

}  // namespace

int ckpt_command(int argc, char** argv) {
  if (argc < 1 || !std::strcmp(argv[0], "-h") || !std::strcmp(argv[0], "--help")) {
    usage(argc < 1 ? stderr : stdout);
    return argc < 1 ? 2 : 0;
  }
  const std::string cmd = argv[0];
  const CommandUsage* command = find_command(cmd);
  if (!command) {
    std::fprintf(stderr, "zerod ckpt: unknown command '%s'\n", cmd.c_str());
    usage(stderr);
    return 2;
  }
  std::vector<std::string> rest(argv + 1, argv + argc);
  if (cmd == "import") return import_deepspeed(rest);
  // Every option is checked here, before the checkpoint is looked for or
  // anything written: a usage error exits 2 whatever is on disk.
  std::string dir, to, tag, dtype = "fp32";
  int world = 0;
  unsigned threads = 0;
  uint64_t max_shard = 0;
  bool verify = false;
  for (size_t i = 0; i < rest.size(); ++i) {
    const std::string& a = rest[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= rest.size()) {
        std::fprintf(stderr, "zerod ckpt %s: %s needs a value\n", cmd.c_str(), a.c_str());
        std::exit(2);
      }
      return rest[++i];
    };
    if (is_help(a)) {
      usage(stdout, command);
      return 0;
    } else if (a.size() > 1 && a[0] == '-' && any_command_takes(a) && !listed(command->options, a)) {
      std::fprintf(stderr, "zerod ckpt %s: %s is not an option of %s (it takes %s)\n", cmd.c_str(), a.c_str(),
                   cmd.c_str(), command->options);
      usage(stderr, command);
      return 2;
    } else if (a == "--to") to = value();
    else if (a == "--tag") tag = value();
    else if (a == "--dtype") {
      dtype = value();
      if (!dtype_from_name(dtype)) {
        std::fprintf(stderr, "zerod ckpt export: --dtype takes fp32, bf16 or fp16, got '%s'\n", dtype.c_str());
        return 2;
      }
    } else if (a == "--world") {
      const std::string v = value();
      const auto n = parse_whole(v.c_str());
      if (!n || *n < 1 || *n > ckpt::kMaxShards) {
        std::fprintf(stderr, "zerod ckpt reshard: --world takes a shard count from 1 to %d, got '%s'\n",
                     ckpt::kMaxShards, v.c_str());
        return 2;
      }
      world = static_cast<int>(*n);
    }
    else if (a == "--threads") {
      const std::string v = value();
      const auto n = parse_whole(v.c_str());
      if (!n || *n < 0 || *n > 4096) {
        std::fprintf(stderr, "zerod ckpt %s: --threads takes a count from 0 (one per core) to 4096, got '%s'\n",
                     cmd.c_str(), v.c_str());
        return 2;
      }
      threads = static_cast<unsigned>(*n);
    }
    else if (a == "--verify") verify = true;
    else if (a == "--max-shard-size") {
      const std::string v = value();
      const auto s = scripting::parse_size(v);
      if (!s) {
        std::fprintf(stderr, "zerod ckpt export: --max-shard-size %s is not a size (e.g. 5GiB)\n", v.c_str());
        return 2;
      }
      max_shard = *s;
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "zerod ckpt %s: unknown option %s\n", cmd.c_str(), a.c_str());
      usage(stderr, command);
      return 2;
    } else if (dir.empty()) {
      dir = a;
    } else {
      std::fprintf(stderr, "zerod ckpt %s: unexpected argument '%s'\n", cmd.c_str(), a.c_str());
      return 2;
    }
  }
  if (dir.empty()) {
    std::fprintf(stderr, "zerod ckpt %s: name the checkpoint directory\n", cmd.c_str());
    return 2;
  }
  if (cmd == "export" && to.empty()) {
    std::fprintf(stderr, "zerod ckpt export: --to FILE.safetensors is required\n");
    usage(stderr, command);
    return 2;
  }
  if (cmd == "reshard" && (to.empty() || world < 1)) {
    std::fprintf(stderr, "zerod ckpt reshard: --world M and --to OUT are required\n");
    usage(stderr, command);
    return 2;
  }
  try {
    // A folder of tagged checkpoints: the one its latest names (or --tag's),
    // said before anything else is printed.
    const ckpt::CheckpointDir found = ckpt::find_checkpoint(dir, tag);
    if (found.from_latest)
      std::printf("%s: its 'latest' file names %s: reading %s\n", dir.c_str(), found.tag.c_str(), found.path.c_str());
    else if (!found.tag.empty())
      std::printf("%s: --tag %s: reading %s\n", dir.c_str(), found.tag.c_str(), found.path.c_str());
    dir = found.path;
    if (cmd == "info") return info(dir, verify, threads);
    if (cmd == "export") {
      const auto t0 = std::chrono::steady_clock::now();
      const ckpt::Source src(dir);
      ckpt::ExportOptions o;
      o.out = to;
      o.dtype = dtype;
      o.max_shard_bytes = max_shard;
      o.threads = threads;
      // The folder of --to is made as reshard makes its --to, and removed
      // again when the export fails or refuses (nothing was written).
      MadeDirectories made(std::filesystem::path(to).parent_path());
      const ckpt::ExportResult r = ckpt::export_safetensors(src, o);
      made.keep();
      std::printf("exported %zu parameters of step %lld as %s in %.1f s:\n", src.manifest().params.size(),
                  static_cast<long long>(src.manifest().step), dtype.c_str(), seconds_since(t0));
      for (const auto& f : r.written) std::printf("  %s\n", f.c_str());
      if (!r.removed.empty()) {
        std::printf("removed what an earlier export to %s left that a loader could take for this one:\n",
                    to.c_str());
        for (const auto& f : r.removed) std::printf("  %s\n", f.c_str());
      }
      return 0;
    }
    if (cmd == "reshard") {
      const auto t0 = std::chrono::steady_clock::now();
      const ckpt::Source src(dir);
      ckpt::reshard(src, to, world, threads);
      std::printf("resharded %s (%d shards) into %s (%d shards) in %.1f s\n", dir.c_str(), src.manifest().world_size,
                  to.c_str(), world, seconds_since(t0));
      return 0;
    }
    return 2;  // not reached: the commands are checked above (import returned before)
  } catch (const Error& e) {
    std::fprintf(stderr, "zerod ckpt %s: %s (%s)\n", cmd.c_str(), e.what(), status_name(e.code()));
    return 1;
  }
}

}  // namespace zerod::cli
