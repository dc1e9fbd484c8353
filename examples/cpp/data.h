// What the GPT trains on: a corpus of tokens, the batch of every
// micro-batch drawn from it the same way on every rank, and the files the
// PyTorch reference (reference.py) reads to train the same model on the
// same batches from the same initial weights.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpt {

struct Corpus {
  std::string alphabet;          // token i is the byte alphabet[i]
  std::vector<int32_t> tokens;
  std::string source;            // what it is, for the log
  double entropy_floor = -1.0;   // nats per token no model can beat; < 0: unknown
};

// A made-up language every machine can generate: 65,536 tokens of 16
// letters where each letter follows from the two before it, one of three
// successors with probabilities 0.7, 0.2, 0.1 (a second-order Markov chain
// drawn from `seed`). A model must look one token back (attention) to get
// below what the current letter alone predicts; the floor is the chain's
// entropy, 0.80 nats.
Corpus synthetic_corpus(uint64_t seed);

// Every byte of a text file is a token; the alphabet is the bytes it uses.
// Throws std::runtime_error naming the file if it cannot be read or is
// shorter than `min_tokens`.
Corpus text_corpus(const std::string& path, size_t min_tokens);

// The global batch of micro-batch `step`: `rows` sequences of T + 1 tokens
// (inputs and, shifted by one, targets), row-major. Rank k of W takes rows
// [k * rows / W, (k + 1) * rows / W).
std::vector<int32_t> global_batch(const Corpus& corpus, int64_t step, int rows, int T, uint64_t seed);

// One parameter's name, shape and initial values, for the reference.
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// Writes dir/manifest.txt (the model's sizes, the batches' and the
// parameters' names and shapes), dir/params.f32 (the initial values in the
// manifest's order) and dir/batches.i32 (`steps` global batches), all
// little-endian. Throws std::runtime_error naming the file on failure.
struct ReferenceSizes {
  int vocab, block, layers, heads, embd, global_rows, steps;
};
void write_reference_inputs(const std::string& dir, const ReferenceSizes& sizes,
                            const std::vector<NamedTensor>& params, const Corpus& corpus, uint64_t seed);

}  // namespace gpt
