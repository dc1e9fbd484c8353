#include "data.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "rng.h"

namespace gpt {

Corpus synthetic_corpus(uint64_t seed) {
  constexpr int kLetters = 16, kSuccessors = 3;
  constexpr double kProb[kSuccessors] = {0.7, 0.2, 0.1};
  Corpus c;
  for (int i = 0; i < kLetters; ++i) c.alphabet.push_back(static_cast<char>('a' + i));
  // The chain: for every pair of letters, three distinct successors.
  std::vector<int> next(kLetters * kLetters * kSuccessors);
  Rng draw(mix64(seed));
  for (int ctx = 0; ctx < kLetters * kLetters; ++ctx) {
    int* s = &next[static_cast<size_t>(ctx) * kSuccessors];
    for (int k = 0; k < kSuccessors; ++k) {
      bool fresh;
      do {
        s[k] = static_cast<int>(draw.next() % kLetters);
        fresh = true;
        for (int j = 0; j < k; ++j) fresh = fresh && s[j] != s[k];
      } while (!fresh);
    }
  }
  c.tokens = {0, 1};
  c.tokens.reserve(65536);
  while (c.tokens.size() < 65536) {
    const size_t n = c.tokens.size();
    const int ctx = c.tokens[n - 2] * kLetters + c.tokens[n - 1];
    const double u = draw.uniform();
    const int k = u < kProb[0] ? 0 : u < kProb[0] + kProb[1] ? 1 : 2;
    c.tokens.push_back(next[static_cast<size_t>(ctx) * kSuccessors + k]);
  }
  c.entropy_floor = 0.0;
  for (double p : kProb) c.entropy_floor -= p * std::log(p);
  c.source = "a synthetic second-order Markov chain over 16 letters (seed " + std::to_string(seed) + ")";
  return c;
}

Corpus text_corpus(const std::string& path, size_t min_tokens) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read the text file '" + path + "'");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() < min_tokens)
    throw std::runtime_error("'" + path + "' has " + std::to_string(text.size()) +
                             " bytes; a sequence needs at least " + std::to_string(min_tokens));
  bool used[256] = {};
  for (unsigned char ch : text) used[ch] = true;
  int index[256];
  Corpus c;
  for (int b = 0; b < 256; ++b)
    if (used[b]) {
      index[b] = static_cast<int>(c.alphabet.size());
      c.alphabet.push_back(static_cast<char>(b));
    }
  c.tokens.reserve(text.size());
  for (unsigned char ch : text) c.tokens.push_back(index[ch]);
  c.source = path;
  return c;
}

std::vector<int32_t> global_batch(const Corpus& corpus, int64_t step, int rows, int T, uint64_t seed) {
  std::vector<int32_t> out(static_cast<size_t>(rows) * (T + 1));
  const uint64_t starts = corpus.tokens.size() - static_cast<size_t>(T);  // a start leaves T + 1 tokens
  for (int r = 0; r < rows; ++r) {
    const uint64_t start = mix64(mix64(seed ^ 0xBA7C4ull) + static_cast<uint64_t>(step) * 65537u + r) % starts;
    for (int t = 0; t <= T; ++t)
      out[static_cast<size_t>(r) * (T + 1) + t] = corpus.tokens[start + static_cast<size_t>(t)];
  }
  return out;
}

namespace {

void write_file(const std::string& path, const void* data, size_t bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error("cannot create '" + path + "': " + std::strerror(errno));
  const bool ok = std::fwrite(data, 1, bytes, f) == bytes;
  const int write_error = errno;
  if (std::fclose(f) != 0 || !ok)
    throw std::runtime_error("cannot write '" + path + "': " + std::strerror(ok ? errno : write_error));
}

// --dump DIR is made with its parents, as `mkdir -p` would (a new folder
// failed with only "cannot create 'DIR/manifest.txt'").
void make_folder(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw std::runtime_error("cannot create the folder '" + dir + "': " + ec.message());
}

}  // namespace

void write_reference_inputs(const std::string& dir, const ReferenceSizes& sizes,
                            const std::vector<NamedTensor>& params, const Corpus& corpus, uint64_t seed) {
  std::string manifest = "vocab " + std::to_string(sizes.vocab) + "\nblock " + std::to_string(sizes.block) +
                         "\nlayers " + std::to_string(sizes.layers) + "\nheads " + std::to_string(sizes.heads) +
                         "\nembd " + std::to_string(sizes.embd) + "\nglobal_rows " +
                         std::to_string(sizes.global_rows) + "\nsteps " + std::to_string(sizes.steps) + "\n";
  std::vector<float> values;
  for (const NamedTensor& p : params) {
    manifest += "param " + p.name;
    for (int64_t d : p.shape) manifest += " " + std::to_string(d);
    manifest += "\n";
    values.insert(values.end(), p.values.begin(), p.values.end());
  }
  std::vector<int32_t> batches;
  for (int s = 0; s < sizes.steps; ++s) {
    const std::vector<int32_t> b = global_batch(corpus, s, sizes.global_rows, sizes.block, seed);
    batches.insert(batches.end(), b.begin(), b.end());
  }
  make_folder(dir);
  write_file(dir + "/manifest.txt", manifest.data(), manifest.size());
  write_file(dir + "/params.f32", values.data(), values.size() * sizeof(float));
  write_file(dir + "/batches.i32", batches.data(), batches.size() * sizeof(int32_t));
}

}  // namespace gpt
