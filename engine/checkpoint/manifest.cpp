#include "manifest.h"

#include "error.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <locale>
#include <sstream>

namespace zerod::ckpt {

namespace {

// Names may hold anything: spaces, %, control bytes are %XX-escaped.
std::string escape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c <= ' ' || c == '%' || c >= 0x7f) {
      char b[4];
      std::snprintf(b, sizeof b, "%%%02X", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out.empty() ? "%00" : out;  // an empty field would vanish between spaces
}

std::string unescape(const std::string& s, const std::string& where) {
  if (s == "%00") return "";
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (i + 2 >= s.size())
      fail(ZD_ERR_INVALID_ARGUMENT, where + ": a cut-off %XX escape in '" + s + "'");
    const std::string hex = s.substr(i + 1, 2);
    char* end = nullptr;
    const long v = std::strtol(hex.c_str(), &end, 16);
    if (hex.size() != 2 || *end) fail(ZD_ERR_INVALID_ARGUMENT, where + ": a bad %XX escape in '" + s + "'");
    out += static_cast<char>(v);
    i += 2;
  }
  return out;
}

// The manifest's numbers never go through the process's locale: a trainer
// that set a comma-decimal one (setlocale, std::locale::global) would write
// "0x1,8p+1" or "1.000" for 1000, which no reader takes back, and would not
// read the checkpoints other processes wrote.

// An exact hex float as %a writes it ("0x1.8p+1"), which older readers take.
std::string hex_float(double v) {
  char b[64];
  char* at = b;
  if (std::signbit(v)) *at++ = '-';
  if (std::isfinite(v)) {
    *at++ = '0';
    *at++ = 'x';
  }
  const auto r = std::to_chars(at, b + sizeof b, std::fabs(v), std::chars_format::hex);
  return std::string(b, r.ptr);
}

// The whole of `text` as a number: a hex float with its 0x (as written), or
// a decimal one (a hand-written manifest). A comma as the radix point is
// read as one: zerod before 2026-11-29 wrote %a under the trainer's locale,
// and a comma-decimal trainer's checkpoints (0x1,8p-7) loaded then.
bool parse_float(const std::string& raw, double* v) {
  std::string text = raw;
  if (const auto comma = text.find(','); comma != std::string::npos && text.find('.') == std::string::npos &&
                                         text.find(',', comma + 1) == std::string::npos)
    text[comma] = '.';
  const bool negative = !text.empty() && text[0] == '-';
  const char* at = text.data() + (negative ? 1 : 0);
  const char* const end = text.data() + text.size();
  const bool hex = end - at > 2 && at[0] == '0' && (at[1] == 'x' || at[1] == 'X');
  if (hex) at += 2;
  // from_chars takes a '-' of its own: a second one is not a number.
  if (at == end || *at == '-' || *at == '+') return false;
  const auto r = std::from_chars(at, end, *v, hex ? std::chars_format::hex : std::chars_format::general);
  if (r.ec != std::errc() || r.ptr != end) return false;
  if (negative) *v = -*v;
  return true;
}

}  // namespace

void write_file_synced(const std::string& path, const std::string& text, FileAccess access) {
  const std::string tmp = path + ".tmp";
  const int fd = open_to_write(tmp, O_WRONLY | O_TRUNC, access);
  ZD_CHECK_SYS(fd, "creating " + tmp);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      fail(ZD_ERR_IO, "writing " + tmp + ": " + errno_text(err));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    fail(ZD_ERR_IO, "flushing " + tmp + " to disk: " + errno_text(err));
  }
  ::close(fd);
  ZD_CHECK_SYS(::rename(tmp.c_str(), path.c_str()), "renaming " + tmp + " to " + path);
}

std::string unescape_name(const std::string& s, const std::string& where) { return unescape(s, where); }

std::string read_extents(std::istream& line, size_t ndim, ParamEntry* p) {
  uint64_t prod = 1;
  for (size_t i = 0; i < ndim; ++i) {
    int64_t d;
    if (!(line >> d) || d <= 0) return "a bad extent";
    p->shape.push_back(d);
    prod *= static_cast<uint64_t>(d);
  }
  return prod == p->numel ? "" : "its extents do not multiply to its element count";
}

std::string shard_name(int rank, int world_size, int shard_set) {
  char b[64];
  std::snprintf(b, sizeof b, "rank-%05d-of-%05d%s.zdshard", rank, world_size, shard_set == 1 ? "-b" : "");
  return b;
}

int shard_set_to_write(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::exists(dir + "/" + kManifestName, ec)) return 0;
  try {
    return 1 - read_manifest(dir).shard_set;
  } catch (const Error&) {
    return 0;  // no whole checkpoint there to keep
  }
}

void remove_other_shards(const std::string& dir, const Manifest& m) {
  std::error_code ec;
  std::vector<std::string> stale;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    int rank = 0, world = 0;
    char tail[16] = {};
    if (std::sscanf(name.c_str(), "rank-%5d-of-%5d%15s", &rank, &world, tail) != 3) continue;
    if (std::strcmp(tail, ".zdshard") != 0 && std::strcmp(tail, "-b.zdshard") != 0) continue;
    if (name != shard_name(rank, world, 1) && name != shard_name(rank, world, 0)) continue;  // not ours exactly
    if (world == m.world_size && rank < world && name == shard_name(rank, world, m.shard_set)) continue;
    stale.push_back(e.path().string());
  }
  for (const std::string& path : stale) std::filesystem::remove(path, ec);
}

void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

namespace {
std::string manifest_text(const Manifest& m) {
  std::ostringstream o;
  o.imbue(std::locale::classic());
  const std::string scale = hex_float(m.loss_scale);  // exact, as the scaler holds it
  // The oldest format that holds it: older readers read what they can.
  int version = m.tensor_scalars > 0 ? 4 : m.shard_set != 0 ? 3 : m.nodes > 0 ? 2 : 1;
  if (m.error_feedback != Manifest::Held::Unknown || m.rank_copies != Manifest::Held::No) version = 5;
  if (m.lr) version = 6;
  o << "zerod-checkpoint " << version << "\n"
    << "step " << m.step << "\n"
    << "world_size " << m.world_size << "\n"
    << "zero_stage " << m.zero_stage << "\n"
    << "precision " << m.precision << "\n"
    << "optimizer " << escape(m.optimizer) << " " << m.slots.size();
  for (const auto& s : m.slots) o << " " << escape(s);
  o << "\n"
    << "loss_scale " << scale << " " << m.scaler_iteration << " " << m.scaler_last_overflow << " "
    << m.scaler_hysteresis_left << "\n";
  if (m.lr) o << "lr " << hex_float(*m.lr) << "\n";  // exact, as the model holds it
  o << "params " << m.params.size() << "\n";
  for (const ParamEntry& p : m.params) {
    o << "param " << p.numel << " " << p.dtype << " " << p.shape.size();
    for (int64_t d : p.shape) o << " " << d;
    o << " " << escape(p.module) << " " << escape(p.name) << "\n";
  }
  if (m.tensor_scalars > 0) {
    // A line per parameter: its index, then its scalars as exact hex floats.
    o << "tensor_scalars " << m.tensor_scalars << "\n";
    for (size_t i = 0; i < m.params.size(); ++i) {
      o << "scalars " << i;
      for (uint32_t k = 0; k < m.tensor_scalars; ++k)
        o << " " << hex_float(static_cast<double>(m.scalars.at(i * m.tensor_scalars + k)));
      o << "\n";
    }
  }
  switch (m.error_feedback) {
    case Manifest::Held::Unknown: break;
    case Manifest::Held::No: o << "error_feedback none\n"; break;
    case Manifest::Held::Dropped: o << "error_feedback dropped\n"; break;
    case Manifest::Held::Yes:
      o << "error_feedback " << m.error_fused.size();
      for (char fused : m.error_fused) o << (fused ? " fused" : " tensors");
      o << "\n";
      break;
  }
  if (m.rank_copies == Manifest::Held::Yes) o << "rank_copies\n";
  if (m.rank_copies == Manifest::Held::Dropped) o << "rank_copies dropped\n";
  if (m.nodes > 0) {
    o << "nodes " << m.nodes << " " << (m.shared ? "shared" : "node-local") << "\n";
    for (const NodePart& p : m.parts)
      o << "part " << p.node << " " << escape(p.host) << " " << p.first_rank << " " << p.ranks << "\n";
  }
  if (m.shard_set != 0) o << "shard_set " << m.shard_set << "\n";
  o << "end\n";
  return o.str();
}
}  // namespace

void write_manifest(const std::string& dir, const Manifest& m, FileAccess access) {
  write_file_synced(dir + "/" + kManifestName, manifest_text(m), access);
}

void write_manifest_file(const std::string& path, const Manifest& m, FileAccess access) {
  write_file_synced(path, manifest_text(m), access);
}

Manifest read_manifest(const std::string& dir) { return read_manifest_file(dir + "/" + kManifestName, dir); }

Manifest read_manifest_file(const std::string& path, const std::string& dir) {
  std::ifstream in(path);
  if (!in)
    fail(ZD_ERR_IO, "no checkpoint at " + dir + ": " + path + " cannot be read (" + errno_text(errno) +
                        "); a directory without it holds no whole checkpoint");
  Manifest m;
  std::string line;
  int n = 0;
  size_t params = 0;
  bool ended = false;
  auto where = [&] { return path + ":" + std::to_string(n); };
  auto bad = [&](const std::string& what) { fail(ZD_ERR_INVALID_ARGUMENT, where() + ": " + what); };
  while (std::getline(in, line)) {
    ++n;
    std::istringstream f(line);
    f.imbue(std::locale::classic());
    std::string key;
    f >> key;
    if (n == 1) {
      if (key != "zerod-checkpoint") bad("not a zerod checkpoint manifest");
      if (!(f >> m.version)) bad("no format version");
      if (m.version > kFormatVersion)
        bad("format version " + std::to_string(m.version) + " is newer than this zerod reads (" +
            std::to_string(kFormatVersion) + "); use a newer zerod");
      continue;
    }
    if (key == "step") {
      if (!(f >> m.step) || m.step < 0) bad("a bad step");
    } else if (key == "world_size") {
      if (!(f >> m.world_size) || m.world_size < 1) bad("a bad world_size");
    } else if (key == "zero_stage") {
      if (!(f >> m.zero_stage) || m.zero_stage < 0 || m.zero_stage > 3) bad("a bad zero_stage");
    } else if (key == "precision") {
      f >> m.precision;
    } else if (key == "optimizer") {
      std::string name;
      size_t count = 0;
      if (!(f >> name >> count) || count > 64) bad("a bad optimizer line");
      m.optimizer = unescape(name, where());
      for (size_t i = 0; i < count; ++i) {
        std::string s;
        if (!(f >> s)) bad("fewer state slot names than counted");
        m.slots.push_back(unescape(s, where()));
      }
    } else if (key == "loss_scale") {
      std::string scale;
      if (!(f >> scale >> m.scaler_iteration >> m.scaler_last_overflow >> m.scaler_hysteresis_left))
        bad("a bad loss_scale line");
      if (!parse_float(scale, &m.loss_scale)) bad("a bad loss scale '" + scale + "'");
    } else if (key == "lr") {
      std::string v;
      double lr = 0;
      if (!(f >> v) || m.lr) bad("a bad lr line");
      if (!parse_float(v, &lr) || !std::isfinite(lr) || lr < 0) bad("a bad lr '" + v + "' (a finite learning rate >= 0)");
      m.lr = lr;
    } else if (key == "params") {
      if (!(f >> params) || params > (size_t{1} << 26)) bad("a bad parameter count");
      m.params.reserve(params);
    } else if (key == "param") {
      ParamEntry p;
      size_t ndim = 0;
      std::string module, name;
      if (!(f >> p.numel >> p.dtype >> ndim) || ndim < 1 || ndim > 8) bad("a bad param line");
      if (const std::string why = read_extents(f, ndim, &p); !why.empty()) bad(why);
      if (!(f >> module >> name)) bad("a param line without module and name");
      p.module = unescape(module, where());
      p.name = unescape(name, where());
      m.params.push_back(std::move(p));
    } else if (key == "tensor_scalars") {
      if (!(f >> m.tensor_scalars) || m.tensor_scalars < 1 || m.tensor_scalars > 64 || !m.scalars.empty())
        bad("a bad tensor_scalars line");
    } else if (key == "scalars") {
      size_t i = 0;
      if (m.tensor_scalars == 0 || !(f >> i) || i != m.scalars.size() / m.tensor_scalars)
        bad("a scalars line out of place (after tensor_scalars, one per parameter in order)");
      for (uint32_t k = 0; k < m.tensor_scalars; ++k) {
        std::string v;
        double scalar = 0;
        if (!(f >> v)) bad("fewer scalars than tensor_scalars says");
        if (!parse_float(v, &scalar)) bad("a bad scalar '" + v + "'");
        m.scalars.push_back(static_cast<float>(scalar));
      }
    } else if (key == "error_feedback") {
      std::string how;
      if (!(f >> how) || m.error_feedback != Manifest::Held::Unknown) bad("a bad error_feedback line");
      if (how == "none") {
        m.error_feedback = Manifest::Held::No;
      } else if (how == "dropped") {
        m.error_feedback = Manifest::Held::Dropped;
      } else {
        char* end = nullptr;
        const unsigned long groups = std::strtoul(how.c_str(), &end, 10);
        if (*end || groups < 1 || groups > 64) bad("a bad error_feedback line (none, dropped, or a group count)");
        m.error_feedback = Manifest::Held::Yes;
        for (unsigned long g = 0; g < groups; ++g) {
          if (!(f >> how) || (how != "fused" && how != "tensors"))
            bad("an error_feedback line without 'fused' or 'tensors' for each of its " + std::to_string(groups) +
                " groups");
          m.error_fused.push_back(how == "fused" ? 1 : 0);
        }
      }
    } else if (key == "rank_copies") {
      std::string how;
      m.rank_copies = f >> how ? Manifest::Held::Dropped : Manifest::Held::Yes;
      if (m.rank_copies == Manifest::Held::Dropped && how != "dropped") bad("a bad rank_copies line");
    } else if (key == "nodes") {
      std::string how;
      if (!(f >> m.nodes >> how) || m.nodes < 1 || (how != "shared" && how != "node-local")) bad("a bad nodes line");
      m.shared = how == "shared";
    } else if (key == "part") {
      NodePart p;
      std::string host;
      if (!(f >> p.node >> host >> p.first_rank >> p.ranks) || p.node < 0 || p.first_rank < 0 || p.ranks < 1)
        bad("a bad part line");
      p.host = unescape(host, where());
      m.parts.push_back(std::move(p));
    } else if (key == "shard_set") {
      if (!(f >> m.shard_set) || m.shard_set < 0 || m.shard_set > 1) bad("a bad shard_set (0 or 1)");
    } else if (key == "end") {
      ended = true;
      break;
    } else if (!key.empty()) {
      bad("unknown key '" + key + "'");
    }
  }
  if (!ended) fail(ZD_ERR_INVALID_ARGUMENT, path + ": cut off (no 'end' line)");
  if (m.params.size() != params)
    fail(ZD_ERR_INVALID_ARGUMENT, path + ": counts " + std::to_string(params) + " parameters but lists " +
                                      std::to_string(m.params.size()));
  if (m.scalars.size() != m.params.size() * m.tensor_scalars)
    fail(ZD_ERR_INVALID_ARGUMENT, path + ": holds the per-tensor scalars of " +
                                      std::to_string(m.scalars.size() / std::max<uint32_t>(1, m.tensor_scalars)) +
                                      " parameters, not of all " + std::to_string(m.params.size()));
  return m;
}

}  // namespace zerod::ckpt
