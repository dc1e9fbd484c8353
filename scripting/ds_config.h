// A DeepSpeed JSON config as a zerod job: translated into the Lua job
// script that does the same, which is then checked like any other. Every
// key DeepSpeed reads is either translated, accepted and ignored (it only
// tunes DeepSpeed's internals; the tables in ds_config.cpp say why, and
// docs/integrations.md lists them), or refused naming the key and why.
// Unknown keys are refused with a suggestion, as in Lua job scripts.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace zerod::scripting {

struct DsOptions {
  // Ranks of the job, when known: DeepSpeed derives the accumulation steps
  // from train_batch_size and the micro-batch size per rank with it.
  int world_size = 0;
  // How the caller's user gives the rank count ("--world-size N"), named in
  // the advice when a config needs it and world_size is 0; "" names the
  // zerod commands that take it.
  std::string world_size_option;
};

struct DsTranslation {
  std::string lua;             // the job script
  std::vector<int> json_line;  // [n] = the config line Lua line n came from (0: none)
};

// True for text that is a JSON object (a Lua chunk cannot begin with '{').
bool looks_like_json(std::string_view text);

// Translates a DeepSpeed config. Throws zerod::Error ZD_ERR_CONFIG listing
// every problem, one per line, as "source:line: key: why".
DsTranslation translate_deepspeed(const std::string& json, const std::string& source, const DsOptions& opt = {});

// The keys the translation knows, as Markdown: what each translates to, the
// ones accepted and ignored with the reason, the ones refused unless left at
// DeepSpeed's default (for docs/integrations.md; a test holds the two equal).
std::string deepspeed_keys_markdown();

}  // namespace zerod::scripting
