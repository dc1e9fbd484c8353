// libFuzzer target: the DeepSpeed-config translator (scripting::
// translate_deepspeed, protobuf's JSON parser underneath) on arbitrary text,
// then the Lua job script it produced, loaded as `zerod run config.json`
// would. A refusal is a zerod::Error; anything else escaping, or a crash, is
// a bug. The translated script must always load or be refused with a
// zerod::Error: a translation that yields Lua the reader chokes on in any
// other way is a bug too.
#include "ds_config.h"
#include "error.h"
#include "job_script.h"
#include "keep_plugins.h"

#include <cstdint>
#include <cstdlib>
#include <string>

using namespace zerod;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("ZEROD_PLUGIN_PATH", ZEROD_FUZZ_PLUGIN_DIR, 1);
  setenv("ZEROD_LOG", "error", 1);
  zerod_fuzz_keep_plugins_loaded(ZEROD_FUZZ_PLUGIN_DIR);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string json(reinterpret_cast<const char*>(data), size);
  // The world size DeepSpeed's batch arithmetic divides by: 0 (unknown) and
  // a few real ones, picked by the input so every one is reached.
  scripting::DsOptions opt;
  opt.world_size = size ? static_cast<int>(data[0] % 4) : 0;
  scripting::DsTranslation tr;
  try {
    tr = scripting::translate_deepspeed(json, "fuzz.json", opt);
  } catch (const Error&) {
    return 0;  // refused, naming the key: what a bad config should get
  }
  scripting::ScriptSource src;
  src.text = tr.lua;
  src.name = "fuzz.json.lua";
  src.allow_io = false;
  try {
    auto script = scripting::JobScript::load(src);
    (void)script->resolved();
    for (int64_t step : {int64_t{0}, int64_t{1}, int64_t{1000000}}) (void)script->lr(step);
  } catch (const Error&) {
  }
  return 0;
}
