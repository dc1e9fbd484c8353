// libFuzzer target: the Lua job-script reader (scripting::JobScript::load:
// the sandbox, the typed schema, the plugins a script names) on arbitrary
// script text, then the hooks a loaded script carries (lr, placement). A
// refusal is a zerod::Error; anything else escaping, or a crash, is a bug.
#include "error.h"
#include "keep_plugins.h"
#include "job_script.h"

#include <cstdint>
#include <cstdlib>
#include <string>

using namespace zerod;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // The plugins of this build, and no log noise per input.
  setenv("ZEROD_PLUGIN_PATH", ZEROD_FUZZ_PLUGIN_DIR, 1);
  setenv("ZEROD_LOG", "error", 1);
  zerod_fuzz_keep_plugins_loaded(ZEROD_FUZZ_PLUGIN_DIR);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  scripting::ScriptSource src;
  src.text.assign(reinterpret_cast<const char*>(data), size);
  src.name = "fuzz.lua";
  src.allow_io = false;  // never: a fuzzed script must not touch files
  try {
    auto script = scripting::JobScript::load(src);
    (void)script->resolved();
    for (int64_t step : {int64_t{0}, int64_t{1}, int64_t{1000000}}) (void)script->lr(step);
    TensorInfo t;
    t.name = "layer0.weight";
    t.kind = "optimizer";
    t.module = "layer0";
    t.numel = 1 << 20;
    t.bytes = 8 << 20;
    (void)script->placement(t);
  } catch (const Error&) {
    // A refusal, with its file:line: what a bad script should get.
  }
  return 0;
}
