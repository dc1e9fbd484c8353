#include "tools.h"

#include "runtime/dtype.h"
#include "error.h"
#include "log.h"
#include "memory/ledger.h"
#include "runtime/thread_pool.h"
#include "torch_state.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <optional>
#include <sstream>
#include <string_view>
#include <utility>

namespace zerod::ckpt {

namespace fs = std::filesystem;

namespace {

unsigned thread_count(unsigned asked) { return asked ? asked : available_cores(); }

// Runs fn(i) for i in [0, n) on `threads` threads; rethrows the first error.
void parallel(size_t n, unsigned threads, const std::function<void(size_t)>& fn) {
  ThreadPool pool(std::min<unsigned>(thread_count(threads), static_cast<unsigned>(std::max<size_t>(n, 1))));
  pool.run(n, fn);
}

std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += static_cast<char>(c);
    } else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += static_cast<char>(c);
    }
  }
  return o + "\"";
}

void pwrite_all(int fd, const void* data, size_t n, uint64_t at, const std::string& path) {
  const auto* p = static_cast<const std::byte*>(data);
  while (n) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(at));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) fail(ZD_ERR_IO, "writing " + path + ": " + errno_text(errno));
    p += w;
    n -= static_cast<size_t>(w);
    at += static_cast<uint64_t>(w);
  }
}

bool has_manifest(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / kManifestName, ec);
}

// Why `dir` (a tag directory, or what the user named) holds no zerod
// checkpoint, in the words of the error.
std::string not_a_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return dir + " is not a directory";
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with("_model_states.pt") || name.ends_with("_optim_states.pt"))
      return dir + " holds DeepSpeed's own checkpoint files (" + name +
             "), not zerod's: `zerod ckpt import` converts them";
    if (name.starts_with("node-") && name.ends_with(".part"))
      return dir + " holds one node's part of a snapshot taken across nodes on node-local disks (" + name +
             "); node 0's directory of the same name holds the manifest: copy every node's files into one "
             "directory to read it whole";
  }
  return dir + " has no " + kManifestName;
}

}  // namespace

std::string latest_tag(const std::string& dir) {
  const fs::path latest = fs::path(dir) / "latest";
  std::error_code ec;
  if (!fs::is_regular_file(latest, ec)) return "";
  std::ifstream in(latest);
  std::stringstream text;
  text << in.rdbuf();
  std::string t = text.str();
  const auto first = t.find_first_not_of(" \t\r\n");
  t = first == std::string::npos ? "" : t.substr(first, t.find_last_not_of(" \t\r\n") - first + 1);
  if (!in || t.empty()) fail(ZD_ERR_IO, latest.string() + " names no tag");
  return t;
}

std::string held_beyond_slots(const Manifest& m) {
  std::ostringstream o;
  if (m.tensor_scalars > 0)
    o << "  the optimizer's per-tensor scalars: " << m.tensor_scalars << " per parameter\n";
  const std::string ranks = std::to_string(m.world_size) + " rank" + (m.world_size == 1 ? "" : "s");
  switch (m.error_feedback) {
    case Manifest::Held::Unknown: break;
    case Manifest::Held::No: o << "  error feedback: none (no 1-bit exchange since its last restart)\n"; break;
    case Manifest::Held::Dropped:
      o << "  error feedback: dropped (resharded to another world size); a load starts it at zero\n";
      break;
    case Manifest::Held::Yes:
      o << "  error feedback: each rank's own, in its shard; a load by " << ranks
        << " restores it, any other starts it at zero\n";
      break;
  }
  if (m.rank_copies == Manifest::Held::Yes)
    o << "  each rank's own master and state (0/1 Adam's local steps): a load by " << ranks
      << " at stage 0 restores them, any other gives every rank rank 0's\n";
  if (m.rank_copies == Manifest::Held::Dropped)
    o << "  each rank's own master and state: dropped (resharded); every rank loads rank 0's\n";
  return o.str();
}

CheckpointDir find_checkpoint(const std::string& dir, const std::string& tag) {
  CheckpointDir out;
  if (!tag.empty()) {
    out.path = (fs::path(dir) / tag).string();
    out.tag = tag;
    if (!has_manifest(out.path))
      fail(ZD_ERR_IO, "no checkpoint with tag '" + tag + "' in " + dir + ": " + not_a_checkpoint(out.path));
    return out;
  }
  out.path = dir;
  if (has_manifest(dir)) return out;
  const std::string t = latest_tag(dir);
  if (t.empty())
    fail(ZD_ERR_IO, "no checkpoint at " + dir + ": " + not_a_checkpoint(dir) +
                        " and no 'latest' file naming a tag directory (as save_checkpoint writes; --tag names one)");
  out.tag = t;
  out.from_latest = true;
  out.path = (fs::path(dir) / t).string();
  if (!has_manifest(out.path))
    fail(ZD_ERR_IO, "no checkpoint at " + dir + ": its 'latest' file names '" + t + "', but " +
                        not_a_checkpoint(out.path) + " (--tag picks another)");
  return out;
}

uint64_t verify_all(const Source& src, unsigned threads) {
  const Manifest& m = src.manifest();
  const uint32_t buffers = static_cast<uint32_t>(m.slots.size()) + 1;
  std::vector<std::pair<uint32_t, uint32_t>> work;
  for (uint32_t p = 0; p < m.params.size(); ++p)
    for (uint32_t b = 0; b < buffers; ++b) work.emplace_back(p, b);
  std::atomic<uint64_t> records{0};
  parallel(work.size(), threads, [&](size_t i) {
    const auto [p, b] = work[i];
    src.verify(p, b, 0, m.params[p].numel);  // every element of every buffer is there and whole
    records.fetch_add(1);
  });
  // And what each rank holds alone (its error feedback, its own copy).
  parallel(static_cast<size_t>(m.world_size), threads,
           [&](size_t r) { records.fetch_add(src.verify_rank(static_cast<int>(r))); });
  return records.load();
}

namespace {

// The exact openings of what export_safetensors writes: the safetensors
// header (after its 8-byte length) and the index. Another tool's file of
// the same name does not begin so (Hugging Face's index is indented
// json.dumps: "{\n  \"metadata\": {\n    ...").
constexpr std::string_view kExportHeader = R"({"__metadata__":{"format":"pt","zerod_step":")";
constexpr std::string_view kExportIndex = "{\n  \"metadata\": {\"total_size\": ";

// Whether the regular file at path begins as zerod's export writes it.
bool written_by_export(const std::string& path, bool index) {
  std::error_code ec;
  if (!fs::is_regular_file(fs::symlink_status(path, ec))) return false;
  std::ifstream in(path, std::ios::binary);
  const std::string_view want = index ? kExportIndex : kExportHeader;
  if (!index) {
    uint64_t len = 0;
    if (!in.read(reinterpret_cast<char*>(&len), 8) || len < want.size()) return false;
  }
  std::string got(want.size(), '\0');
  return static_cast<bool>(in.read(got.data(), static_cast<std::streamsize>(got.size()))) && got == want;
}

// Whether a file name is <stem>-<n>-of-<count>.safetensors or, of the
// second set (shard_names), <stem>-<n>-of-<count>-b.safetensors, each
// number of five digits or more: a shard that an export to `stem` writes.
bool shard_of(const std::string& file, const std::string& stem) {
  const std::string ext = ".safetensors";
  if (file.size() <= stem.size() + 1 + ext.size() || file.compare(0, stem.size(), stem) != 0 ||
      file[stem.size()] != '-' || file.compare(file.size() - ext.size(), ext.size(), ext) != 0)
    return false;
  std::string mid = file.substr(stem.size() + 1, file.size() - stem.size() - 1 - ext.size());
  if (mid.ends_with("-b")) mid.resize(mid.size() - 2);
  const size_t of = mid.find("-of-");
  auto number = [](const std::string& d) {
    return d.size() >= 5 && std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  return of != std::string::npos && number(mid.substr(0, of)) && number(mid.substr(of + 4));
}

// The files an export to `out` (stem `stem`) would find beside the ones it
// writes (`names`, the index among them where sharded), which an earlier
// export to the same output may have written: the one file where this one
// writes shards; the index where it writes one file; shards of any count
// but this one's. Refuses, before anything is written, where one of them
// is not an export's: removing it could lose a user's file, and keeping it
// leaves a loader two models to choose from.
std::vector<std::string> stale_exports(const std::string& out, const std::string& stem,
                                       const std::vector<std::string>& names) {
  const bool sharded = names.size() > 1;
  auto ours = [&](const std::string& p) { return std::find(names.begin(), names.end(), p) != names.end(); };
  std::vector<std::pair<std::string, bool>> found;  // (path, is an index)
  auto exists = [](const std::string& p) {
    std::error_code ec;
    return fs::exists(fs::symlink_status(p, ec));
  };
  if (sharded && exists(out) && !ours(out)) found.emplace_back(out, false);
  const std::string index = stem + ".safetensors.index.json";
  if (!sharded && exists(index)) found.emplace_back(index, true);
  const fs::path folder = fs::path(stem).parent_path();
  const std::string stem_name = fs::path(stem).filename().string();
  // A folder that cannot be listed is taken to hold no earlier export (one
  // that is not there: creating the files then fails, naming it).
  std::error_code ec;
  for (fs::directory_iterator it(folder.empty() ? fs::path(".") : folder, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string file = it->path().filename().string();
    if (!shard_of(file, stem_name)) continue;
    const std::string p = folder.empty() ? file : (folder / file).string();
    if (!ours(p)) found.emplace_back(p, false);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> stale;
  for (const auto& [p, is_index] : found) {
    if (!written_by_export(p, is_index)) {
      const std::string what = is_index ? "index" : "safetensors header";
      fail(ZD_ERR_INVALID_ARGUMENT, "export: " + p + " lies beside " + out + " under a name an export to " + out +
                                        " writes, and zerod's export did not write it (it does not open as "
                                        "zerod's " + what + " does): a loader could read it instead of this "
                                        "export. Nothing was written; move it away, or export to another name");
    }
    stale.push_back(p);
  }
  return stale;
}

// Refuses, before anything is written, an export whose files would replace
// what it must not: a file at one of its names (`names`, the index last
// where sharded) that zerod's export did not write (a user's notes, another
// tool's model), and anything in the source checkpoint's own directory (its
// manifest or a shard, renamed over, would lose the checkpoint being read).
void refuse_replacing(const Source& src, const std::string& out, const std::vector<std::string>& names) {
  const fs::path folder = fs::path(out).parent_path();
  std::error_code ec;
  // Any spelling of the directory ("ck/", "./ck", a symlink); a folder that
  // is not there is not the checkpoint's (creating the files fails, naming it).
  if (fs::equivalent(folder.empty() ? fs::path(".") : folder, src.dir(), ec) && !ec)
    fail(ZD_ERR_INVALID_ARGUMENT, "export: --to " + out + " is in the checkpoint's own directory " + src.dir() +
                                      ", whose files it could replace. Nothing was written; export to another "
                                      "directory");
  const bool sharded = names.size() > 1;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& p = names[i];
    const bool is_index = sharded && i + 1 == names.size();
    if (!fs::exists(fs::symlink_status(p, ec)) || written_by_export(p, is_index)) continue;
    fail(ZD_ERR_INVALID_ARGUMENT, "export: " + p + " is there already and zerod's export did not write it (it " +
                                      "does not open as zerod's " + (is_index ? "index" : "safetensors header") +
                                      " does): this export would replace it. Nothing was written; move it away, "
                                      "or export to another name");
  }
}

// One tensor of an export: a zerod parameter's master (param >= 0),
// converted to the export's dtype, or a tensor torch holds outside zerod
// (torch_state.safetensors: a buffer, a frozen parameter), copied in its
// own dtype as the model held it.
struct ExportItem {
  std::string name;
  std::string dtype;  // safetensors' name
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
  int64_t param = -1;
  const TorchTensor* torch = nullptr;
};

std::vector<ExportItem> export_items(const Manifest& m, const std::optional<TorchTensors>& torch, const char* dtype,
                                     size_t esz) {
  std::vector<ExportItem> items;
  std::vector<std::string> names;
  for (size_t i = 0; i < m.params.size(); ++i) {
    const ParamEntry& p = m.params[i];
    ExportItem it{p.name, dtype, p.shape, p.numel * esz, static_cast<int64_t>(i), nullptr};
    // zerod registers a 0-dim parameter as (1,) (zd_param_desc's ndim is
    // 1..ZD_MAX_DIMS); zerod.torch names the ones torch holds as 0-dim, and
    // a loader wants their own shape (from_pretrained refuses [1] for a
    // CLIP logit_scale).
    if (torch && p.shape == std::vector<int64_t>{1} &&
        std::find(torch->scalar_params.begin(), torch->scalar_params.end(), p.name) != torch->scalar_params.end())
      it.shape.clear();
    items.push_back(std::move(it));
    names.push_back(p.name);
  }
  if (torch)
    for (const TorchTensor& t : torch->tensors) {
      items.push_back({t.name, t.dtype, t.shape, t.bytes, -1, &t});
      names.push_back(t.name);
    }
  std::sort(names.begin(), names.end());
  if (const auto twice = std::adjacent_find(names.begin(), names.end()); twice != names.end())
    fail(ZD_ERR_INVALID_ARGUMENT, "export: '" + *twice + "' is both a parameter zerod holds and a tensor of " +
                                      (torch ? torch->path : std::string("torch_state")) + "; nothing was written");
  return items;
}

// Says what a checkpoint holds that its export leaves out: tensors torch
// held outside zerod that only a pickle (torch_state.pt) has, which only
// torch reads.
void warn_what_export_leaves_out(const Source& src, const std::optional<TorchTensors>& torch) {
  if (torch) {
    if (torch->pickled_only)
      log_warn("export: " + std::to_string(torch->pickled_only) + " tensor(s) torch held outside zerod are of a "
               "dtype safetensors has no name for, so only " + src.dir() + "/" + kTorchStatePickle +
               " holds them: this export leaves them out");
    return;
  }
  for (const char* name : {kTorchStateTensors, kTorchStateTensorsStaged}) {
    const std::string other = src.dir() + "/" + name;
    std::error_code ec;
    if (!fs::is_regular_file(other, ec)) continue;
    log_warn("export: " + other + " is of step " + std::to_string(read_torch_tensors(other).step) + ", not the " +
             "checkpoint's " + std::to_string(src.manifest().step) + " (a file of another save copied in?): this "
             "export leaves out the tensors torch held outside zerod");
    return;
  }
  for (const char* name : {kTorchStatePickle, kTorchStatePickleStaged}) {
    const std::string pickle = src.dir() + "/" + name;
    const uint64_t n = pickled_tensor_count(pickle);
    if (!n) continue;
    log_warn("export: " + pickle + " holds " + std::to_string(n) + " tensor(s) (buffers, frozen parameters, any of "
             "its client_state) that this export leaves out: it has no " + kTorchStateTensors + " of step " +
             std::to_string(src.manifest().step) + " (a zerod.torch from before it, or `zerod ckpt import`, "
             "wrote the checkpoint), and only torch reads a pickle. Load the checkpoint with zerod.torch and "
             "save it again to export them");
    return;
  }
}

// Items into files of at most max_shard_bytes (0: one file), in order; a
// bigger item makes a file alone.
std::vector<std::vector<size_t>> split_into_files(const std::vector<ExportItem>& items, uint64_t max_shard_bytes) {
  std::vector<std::vector<size_t>> files(1);
  uint64_t in_file = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (max_shard_bytes && !files.back().empty() && in_file + items[i].bytes > max_shard_bytes) {
      files.emplace_back();
      in_file = 0;
    }
    files.back().push_back(i);
    in_file += items[i].bytes;
  }
  return files;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The files of an export to `out` in `count` files: out itself, or shards
// <stem>-00001-of-0000N.safetensors. A sharded export over an earlier one
// of the same count takes the other set of names (-b before the extension,
// and back), as a checkpoint saved over another takes the other shard set:
// the earlier export's shards stay as they were until the index naming the
// new ones replaces its own (written last), so an export that fails or is
// killed part way mixes no step with another.
std::vector<std::string> export_names(const std::string& out, const std::string& stem, size_t count) {
  if (count == 1) return {out};
  const std::string index = stem + ".safetensors.index.json";
  const std::string earlier = written_by_export(index, true) ? read_text(index) : "";
  auto names = [&](bool second_set) {
    std::vector<std::string> v;
    for (size_t f = 0; f < count; ++f) {
      char b[64];
      std::snprintf(b, sizeof b, "-%05zu-of-%05zu%s.safetensors", f + 1, count, second_set ? "-b" : "");
      v.push_back(stem + b);
    }
    return v;
  };
  for (const std::string& name : names(false))
    if (earlier.find(json_string(fs::path(name).filename().string())) != std::string::npos) return names(true);
  return names(false);
}

std::string file_header(int64_t step, const std::vector<ExportItem>& items, const std::vector<size_t>& in_file) {
  std::ostringstream h;
  h << "{\"__metadata__\":{\"format\":\"pt\",\"zerod_step\":\"" << step << "\"}";
  uint64_t at = 0;
  for (size_t i : in_file) {
    const ExportItem& it = items[i];
    h << "," << json_string(it.name) << ":{\"dtype\":\"" << it.dtype << "\",\"shape\":[";
    for (size_t d = 0; d < it.shape.size(); ++d) h << (d ? "," : "") << it.shape[d];
    h << "],\"data_offsets\":[" << at << "," << at + it.bytes << "]}";
    at += it.bytes;
  }
  h << "}";
  std::string header = h.str();
  header.append((8 - header.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  return header;
}

std::string index_text(const std::vector<ExportItem>& items, const std::vector<std::vector<size_t>>& files,
                       const std::vector<std::string>& names) {
  uint64_t total = 0;
  for (const ExportItem& it : items) total += it.bytes;
  std::ostringstream idx;
  idx << "{\n  \"metadata\": {\"total_size\": " << total << "},\n  \"weight_map\": {";
  bool first = true;
  for (size_t f = 0; f < files.size(); ++f)
    for (size_t i : files[f]) {
      idx << (first ? "" : ",") << "\n    " << json_string(items[i].name) << ": "
          << json_string(fs::path(names[f]).filename().string());
      first = false;
    }
  idx << "\n  }\n}\n";
  return idx.str();
}

// Chunks of 2^20 values, one tensor per thread at a time: memory within
// threads x a chunk, whatever the manifest says a tensor holds.
constexpr uint64_t kChunk = uint64_t{1} << 20;

void write_master(const Source& src, uint32_t param, zd_dtype dt, int fd, uint64_t at, const std::string& path) {
  const uint64_t n = src.manifest().params[param].numel;
  const size_t esz = dtype_size(dt);
  std::vector<float> v;
  std::vector<std::byte> w;
  for (uint64_t from = 0; from < n; from += kChunk) {
    const uint64_t k = std::min(kChunk, n - from);
    v.resize(k);
    src.read(param, kMasterBuffer, from, k, v.data());
    if (dt == ZD_DTYPE_F32) {
      pwrite_all(fd, v.data(), k * 4, at + from * 4, path);
    } else {
      w.resize(k * esz);
      convert(v.data(), ZD_DTYPE_F32, w.data(), dt, k);
      pwrite_all(fd, w.data(), w.size(), at + from * esz, path);
    }
  }
}

void copy_bytes(int from_fd, const TorchTensor& t, const std::string& from, int fd, uint64_t at,
                const std::string& path) {
  std::vector<std::byte> b;
  for (uint64_t done = 0; done < t.bytes;) {
    b.resize(std::min<uint64_t>(kChunk * 4, t.bytes - done));
    const ssize_t r = ::pread(from_fd, b.data(), b.size(), static_cast<off_t>(t.offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      fail(ZD_ERR_IO, "export: reading '" + t.name + "' from " + from + ": " + (r ? errno_text(errno) : "cut off"));
    pwrite_all(fd, b.data(), static_cast<size_t>(r), at + done, path);
    done += static_cast<uint64_t>(r);
  }
}

}  // namespace

ExportResult export_safetensors(const Source& src, const ExportOptions& o) {
  const Manifest& m = src.manifest();
  const zd_dtype dt = dtype_from_name(o.dtype);
  if (!dt) fail(ZD_ERR_INVALID_ARGUMENT, "export: --dtype " + o.dtype + " is not fp32, bf16 or fp16");
  const char* st_name = dt == ZD_DTYPE_F32 ? "F32" : dt == ZD_DTYPE_BF16 ? "BF16" : "F16";
  const std::optional<TorchTensors> torch = torch_tensors_of(src.dir(), m.step);
  const std::vector<ExportItem> items = export_items(m, torch, st_name, dtype_size(dt));
  const std::vector<std::vector<size_t>> files = split_into_files(items, o.max_shard_bytes);
  std::string stem = o.out;
  if (stem.size() > 12 && stem.substr(stem.size() - 12) == ".safetensors") stem.resize(stem.size() - 12);
  std::vector<std::string> names = export_names(o.out, stem, files.size());
  // What an earlier export to this output left that this one does not
  // overwrite, removed once this one is whole.
  std::vector<std::string> outputs = names;
  if (files.size() > 1) outputs.push_back(stem + ".safetensors.index.json");
  refuse_replacing(src, o.out, outputs);
  const std::vector<std::string> stale = stale_exports(o.out, stem, outputs);
  warn_what_export_leaves_out(src, torch);
  std::vector<std::pair<size_t, uint64_t>> placed(items.size());  // (file, absolute offset in it)
  // Written under temporary names and renamed when whole: an export that
  // fails (a damaged record, a full disk, Ctrl-C) leaves no file that
  // parses as safetensors with zeros where tensors were missing, and an
  // earlier export at the same path stays as it was. Shards renamed into
  // place go again where the index naming them is not written.
  std::vector<std::string> temps, renamed;
  for (const std::string& name : names) temps.push_back(name + ".zerod-partial");
  std::vector<int> fds(files.size(), -1);
  int torch_fd = -1;
  struct Cleanup {
    std::vector<int>& fds;
    int& torch_fd;
    const std::vector<std::string>& temps;
    const std::vector<std::string>& renamed;
    bool committed = false;
    ~Cleanup() {
      for (int fd : fds)
        if (fd >= 0) ::close(fd);
      if (torch_fd >= 0) ::close(torch_fd);
      if (committed) return;
      for (const std::string& t : temps) ::unlink(t.c_str());
      for (const std::string& r : renamed) ::unlink(r.c_str());
    }
  } cleanup{fds, torch_fd, temps, renamed};
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string header = file_header(m.step, items, files[f]);
    uint64_t off = 8 + header.size();
    for (size_t i : files[f]) {
      placed[i] = {f, off};
      off += items[i].bytes;
    }
    fds[f] = ::open(temps[f].c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fds[f] < 0) fail(ZD_ERR_IO, "export: cannot create " + temps[f] + ": " + errno_text(errno));
    if (::ftruncate(fds[f], static_cast<off_t>(off)) != 0)
      fail(ZD_ERR_IO, "export: cannot size " + temps[f] + " to " + format_bytes(off) + ": " + errno_text(errno));
    const uint64_t len = header.size();
    pwrite_all(fds[f], &len, 8, 0, temps[f]);
    pwrite_all(fds[f], header.data(), header.size(), 8, temps[f]);
  }
  if (torch && !torch->tensors.empty()) {
    torch_fd = ::open(torch->path.c_str(), O_RDONLY | O_CLOEXEC);
    if (torch_fd < 0) fail(ZD_ERR_IO, "export: cannot read " + torch->path + ": " + errno_text(errno));
  }
  parallel(items.size(), o.threads, [&](size_t i) {
    const auto [f, at] = placed[i];
    if (items[i].torch) copy_bytes(torch_fd, *items[i].torch, torch->path, fds[f], at, temps[f]);
    else write_master(src, static_cast<uint32_t>(items[i].param), dt, fds[f], at, temps[f]);
  });
  for (size_t f = 0; f < files.size(); ++f)
    if (::fsync(fds[f]) != 0) fail(ZD_ERR_IO, "export: flushing " + temps[f] + ": " + errno_text(errno));
  for (size_t f = 0; f < files.size(); ++f) {
    if (::rename(temps[f].c_str(), names[f].c_str()) != 0)
      fail(ZD_ERR_IO, "export: renaming " + temps[f] + " to " + names[f] + ": " + errno_text(errno));
    renamed.push_back(names[f]);
  }
  const fs::path folder = fs::path(names.front()).parent_path();
  sync_dir(folder.empty() ? "." : folder.string());
  if (files.size() > 1) {  // the index last: where it is, the files it names are whole
    const std::string index = stem + ".safetensors.index.json";
    write_file_synced(index, index_text(items, files, names));  // checked; renamed into place when whole
    names.push_back(index);
  }
  cleanup.committed = true;
  // Only now, with this export whole, the earlier one's leftovers go.
  ExportResult result;
  for (const std::string& p : stale) {
    if (::unlink(p.c_str()) != 0 && errno != ENOENT)
      fail(ZD_ERR_IO, "export: " + o.out + " is written, but the earlier export's " + p + " beside it cannot be " +
                          "removed: " + errno_text(errno) + "; remove it, or a loader may read it");
    result.removed.push_back(p);
  }
  if (!stale.empty()) sync_dir(folder.empty() ? "." : folder.string());
  result.written = std::move(names);
  return result;
}

Manifest import_raw(const std::string& raw_dir, const std::string& out_dir) {
  const std::string desc = raw_dir + "/params.txt";
  std::ifstream in(desc);
  if (!in) fail(ZD_ERR_IO, "import: " + desc + " cannot be read: " + errno_text(errno));
  Manifest m;
  std::string line;
  int n = 0;
  auto bad = [&](const std::string& what) { fail(ZD_ERR_INVALID_ARGUMENT, desc + ":" + std::to_string(n) + ": " + what); };
  while (std::getline(in, line)) {
    ++n;
    std::istringstream f(line);
    std::string key;
    f >> key;
    if (key == "zerod-import" || key.empty()) continue;
    if (key == "step") {
      if (!(f >> m.step) || m.step < 0) bad("a bad step");
    } else if (key == "zero_stage") {
      if (!(f >> m.zero_stage) || m.zero_stage < 0 || m.zero_stage > 3) bad("a bad zero_stage");
    } else if (key == "precision") {
      f >> m.precision;
    } else if (key == "optimizer") {
      size_t count = 0;
      std::string name;
      if (!(f >> name >> count) || count > 64) bad("a bad optimizer line");
      m.optimizer = unescape_name(name, desc);
      for (size_t i = 0; i < count; ++i) {
        std::string s;
        if (!(f >> s)) bad("fewer state slot names than counted");
        m.slots.push_back(unescape_name(s, desc));
      }
    } else if (key == "param") {
      ParamEntry p;
      size_t ndim = 0;
      std::string name;
      if (!(f >> p.numel >> ndim) || ndim < 1 || ndim > 8) bad("a bad param line");
      if (const std::string why = read_extents(f, ndim, &p); !why.empty()) bad(why);
      if (!(f >> name)) bad("a param line without a name");
      p.name = unescape_name(name, desc);
      p.module = p.name;
      p.dtype = "f32";
      m.params.push_back(std::move(p));
    } else if (key == "end") {
      break;
    } else {
      bad("unknown key '" + key + "'");
    }
  }
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) fail(ZD_ERR_IO, "import: " + out_dir + " cannot be created: " + ec.message());
  // A checkpoint already in out_dir stays whole until the new manifest
  // replaces it (the other shard set; manifest.h).
  m.shard_set = shard_set_to_write(out_dir);
  ShardWriter out(out_dir + "/" + shard_name(0, 1, m.shard_set), 0, 1);
  std::vector<float> chunk;
  for (uint32_t i = 0; i < m.params.size(); ++i) {
    const uint64_t numel = m.params[i].numel;
    for (uint32_t b = 0; b <= m.slots.size(); ++b) {
      const std::string path = raw_dir + "/" + std::to_string(i) + ".b" + std::to_string(b);
      std::ifstream raw(path, std::ios::binary);
      if (!raw) fail(ZD_ERR_IO, "import: " + path + " cannot be read");
      if (fs::file_size(path, ec) != numel * 4)
        fail(ZD_ERR_IO, "import: " + path + " holds " + std::to_string(fs::file_size(path, ec)) + " bytes, " +
                            std::to_string(numel * 4) + " expected");
      out.begin(i, b, 0, numel);
      for (uint64_t at = 0; at < numel; at += uint64_t{1} << 20) {
        const uint64_t k = std::min(uint64_t{1} << 20, numel - at);
        chunk.resize(k);
        if (!raw.read(reinterpret_cast<char*>(chunk.data()), static_cast<std::streamsize>(k * 4)))
          fail(ZD_ERR_IO, "import: reading " + path + ": " + errno_text(errno));
        out.append(chunk.data(), k);
      }
      out.end();
    }
  }
  out.finish();
  m.world_size = 1;
  write_manifest(out_dir, m);
  sync_dir(out_dir);
  remove_other_shards(out_dir, m);
  return m;
}

void reshard(const Source& src, const std::string& out_dir, int world, unsigned threads) {
  if (world < 1 || world > kMaxShards)
    fail(ZD_ERR_INVALID_ARGUMENT, "reshard: --world must be from 1 to " + std::to_string(kMaxShards) + ", got " +
                                      std::to_string(world));
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) fail(ZD_ERR_IO, "reshard: " + out_dir + " cannot be created: " + ec.message());
  // The same directory by any spelling ("ck/", "./ck", a symlink): writing
  // there would truncate the shards being read and drop their manifest.
  if (fs::equivalent(out_dir, src.dir(), ec) || ec)
    fail(ZD_ERR_INVALID_ARGUMENT, "reshard: --to " + out_dir + " is the checkpoint's own directory " + src.dir() +
                                      (ec ? " or cannot be compared with it (" + ec.message() + ")" : "") +
                                      ": write into another directory");
  Manifest m = src.manifest();
  m.shard_set = shard_set_to_write(out_dir);  // a checkpoint already there stays whole until the manifest
  // What each rank holds alone belongs to the checkpoint's world size: its
  // records go to the same rank's shard, or, for another number of shards,
  // nowhere (the error feedback of a rank's 1-bit exchanges, and at stage 0
  // a rank's own copy, mean nothing to the ranks of another world size).
  using Held = Manifest::Held;
  const bool errors = m.error_feedback == Held::Yes, copies = m.rank_copies == Held::Yes;
  const bool per_rank = errors || copies;
  const bool keep_per_rank = world == m.world_size;
  if (per_rank && !keep_per_rank) {
    log_warn("reshard: " + src.dir() + " holds " +
             (errors ? std::string("the error feedback of each rank's 1-bit exchanges") : "") +
             (errors && copies ? " and " : "") +
             (copies ? std::string("each rank's own parameters and optimizer state (0/1 Adam's local steps at "
                                   "ZeRO stage 0)")
                     : "") +
             ", which belongs to its " + std::to_string(m.world_size) + " ranks; the " + std::to_string(world) +
             " shards written leave it out: a job resumed from them goes on " +
             (errors ? std::string("from zero error feedback") : "") + (errors && copies ? " and " : "") +
             (copies ? std::string("with rank 0's copy on every rank") : "") +
             ", near, not bit for bit as, the run that wrote it");
    if (errors) m.error_feedback = Held::Dropped;
    m.error_fused.clear();
    if (copies) m.rank_copies = Held::Dropped;
  }
  const auto buffers = static_cast<uint32_t>(m.slots.size()) + 1;
  const auto w = static_cast<uint64_t>(world);
  parallel(static_cast<size_t>(world), threads, [&](size_t r) {
    ShardWriter out(out_dir + "/" + shard_name(static_cast<int>(r), world, m.shard_set), static_cast<int>(r), world);
    std::vector<float> chunk;
    for (uint32_t p = 0; p < m.params.size(); ++p) {
      const uint64_t n = m.params[p].numel, per = (n + w - 1) / w;
      const uint64_t lo = std::min(n, r * per), hi = std::min(n, lo + per);
      if (lo >= hi) continue;
      for (uint32_t b = 0; b < buffers; ++b) {
        if (!src.has(p, b)) continue;
        out.begin(p, b, lo, hi - lo);
        for (uint64_t at = lo; at < hi; at += uint64_t{1} << 20) {
          const uint64_t k = std::min(uint64_t{1} << 20, hi - at);
          chunk.resize(k);
          src.read(p, b, at, k, chunk.data());
          out.append(chunk.data(), k);
        }
        out.end();
      }
    }
    if (per_rank && keep_per_rank)
      for (const Record& rec : src.rank_records(static_cast<int>(r))) {
        out.begin(rec.param, rec.buffer, rec.first, rec.count);
        for (uint64_t at = rec.first; at < rec.first + rec.count; at += uint64_t{1} << 20) {
          const uint64_t k = std::min(uint64_t{1} << 20, rec.first + rec.count - at);
          chunk.resize(k);
          src.read_rank(static_cast<int>(r), rec.param, rec.buffer, at, k, chunk.data());
          out.append(chunk.data(), k);
        }
        out.end();
      }
    out.finish();
  });
  m.world_size = world;
  m.nodes = 0;  // one directory of M shards, whoever wrote the source
  m.parts.clear();
  // zerod.torch's files (client_state, buffers, frozen parameters) go with
  // the shards, committed as save_checkpoint commits them: without them a
  // resharded checkpoint loaded with client_state {} and the model's
  // buffers as they were.
  const StagedTorchState torch = stage_torch_state(src.dir(), m.step, out_dir);
  write_manifest(out_dir, m);
  sync_dir(out_dir);
  commit_torch_state(out_dir, torch);
  remove_other_shards(out_dir, m);
}

}  // namespace zerod::ckpt
