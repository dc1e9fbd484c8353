// Job scripts seen through the ABI: the sandbox and the schedule library.
#include "abi_fixture.h"

using namespace zerod_test;

class ScriptTest : public AbiTest {
 protected:
  // The error a script gets, "" if it loads.
  std::string error_of(const std::string& script, uint32_t flags = 0) {
    zd_model_options o = ZD_MODEL_OPTIONS_INIT;
    o.script_text = script.c_str();
    o.script_name = "s.lua";
    o.flags = flags;
    zd_model* m = nullptr;
    const zd_status st = zd_model_create(client_, &o, &m);
    zd_model_destroy(m);
    return st == ZD_OK ? "" : last();
  }
};

TEST_F(ScriptTest, NoProcessesNoFilesNoBytecode) {
  EXPECT_NE(error_of("os.execute('true')\nreturn {}").find("s.lua:1:"), std::string::npos);
  EXPECT_NE(error_of("os.remove('/tmp/x')\nreturn {}").find("s.lua:1:"), std::string::npos);
  EXPECT_NE(error_of("local f = io.open('/etc/passwd')\nreturn {}").find("s.lua:1:"),
            std::string::npos);
  EXPECT_NE(error_of("dofile('/etc/passwd')\nreturn {}").find("s.lua:1:"), std::string::npos);
  EXPECT_NE(error_of("require('os')\nreturn {}").find("may only require 'zerod'"), std::string::npos);
  EXPECT_NE(error_of("local f = load(string.dump(function() end))\nreturn {}").find("s.lua:1:"),
            std::string::npos);
  // os.time and friends stay.
  EXPECT_EQ(error_of("local t = os.time()\nreturn {}"), "");
}

TEST_F(ScriptTest, IoIsThereWhenTheCallerAllowsIt) {
  EXPECT_EQ(error_of("assert(io.open)\nreturn {}", ZD_MODEL_ALLOW_SCRIPT_IO), "");
}

TEST_F(ScriptTest, RunawayScriptsAreStopped) {
  EXPECT_NE(error_of("while true do end").find("instructions"), std::string::npos);
  // A pcall catches the budget's error, but not the next one's: the loop
  // around it is stopped too.
  EXPECT_NE(error_of("while true do pcall(function() while true do end end) end").find("instructions"),
            std::string::npos);
  EXPECT_NE(error_of("local co = coroutine.wrap(function() while true do pcall(function() while true do end end) "
                     "coroutine.yield() end end)\nwhile true do pcall(co) end")
                .find("instructions"),
            std::string::npos);
  EXPECT_NE(error_of("local t = {} for i = 1, 1e9 do t[i] = ('x'):rep(100) end").find("memory"),
            std::string::npos);
}

// A table of learning rates with a NaN is refused at the caller's line
// (it was found only when the step came, blamed on the library's line).
TEST_F(ScriptTest, ATableScheduleWithANanIsRefusedAtTheCallersLine) {
  const std::string e = error_of("local lr = zerod.table{ values = { 1e-3, 0/0 } }\nreturn { lr = lr }");
  EXPECT_NE(e.find("s.lua:1: zerod.table: values[2] is"), std::string::npos) << e;
  EXPECT_EQ(error_of("local lr = zerod.table{ values = { 1e-3, 0 } }\nreturn { lr = lr }"), "");
}

// Lua's pattern matcher runs in C, out of the instruction budget's reach:
// a backtracking pattern over a long string ran for hours (zerod check and
// a daemon's session hung). Such calls are refused; everyday ones run.
TEST_F(ScriptTest, PatternsThatCouldRunForHoursAreRefused) {
  const std::string e = error_of("local s = string.rep('a', 5000)\nlocal i = s:find('.-.-.-b')\nreturn {}");
  EXPECT_NE(e.find("string.find: a pattern with 3 repetitions over a 5000-byte string"), std::string::npos) << e;
  EXPECT_NE(error_of("local s = ('a'):rep(100000)\nfor w in s:gmatch('(a*)(a*)b') do end\nreturn {}")
                .find("string.gmatch"),
            std::string::npos);
  EXPECT_EQ(error_of("local a, b = ('h.0.attn.weight'):match('^(.-)%.(.-)$')\n"
                     "assert(a == 'h' and b == '0.attn.weight')\n"
                     "assert(('x'):rep(100000):find('.-.-.-b', 1, true) == nil)\n"  // plain: no pattern
                     "assert(select(2, ('a-b-c'):gsub('[a-c]', 'x')) == 3)\n"
                     "return {}"),
            "");
}

TEST_F(ScriptTest, TheScriptMustReturnATable) {
  const std::string e = error_of("local x = 1\nreturn 42");
  EXPECT_NE(e.find("s.lua:2: a job script must return a table"), std::string::npos) << e;
}

TEST_F(ScriptTest, LibraryErrorsBlameTheCallersLine) {
  const std::string e = error_of(
      "local zerod = require('zerod')\n"
      "return { lr = zerod.cosine{ total_steps = 10, max_lr = 1, warmup = 3 } }");
  EXPECT_NE(e.find("s.lua:2: zerod.cosine: unknown argument 'warmup'"), std::string::npos) << e;
  const std::string e2 = error_of("return { budgets = { device = zerod.size('4 gigs') } }");
  EXPECT_NE(e2.find("s.lua:1: zerod.size: bad size '4 gigs'"), std::string::npos) << e2;
  const std::string e3 = error_of("return { budgets = { device = '4 gigs' } }");
  EXPECT_NE(e3.find("s.lua:1: budgets.device: bad size \"4 gigs\""), std::string::npos) << e3;
}

TEST_F(ScriptTest, KeysInALocalTableStillGetTheirLine) {
  const std::string e = error_of(
      "local opt = {\n"
      "  type = 'sgd',\n"
      "  momentum = 2,\n"
      "}\n"
      "return { optimizer = opt }");
  EXPECT_NE(e.find("s.lua:3: optimizer.momentum: must be < 1, got 2"), std::string::npos) << e;
}

TEST_F(ScriptTest, WrongTypesAreNamed) {
  const std::string e = error_of(
      "return {\n"
      "  gradient_accumulation_steps = 'two',\n"
      "  optimizer = { type = 'adamw', betas = {0.9} },\n"
      "  fp16 = { hysteresis = 2 },\n"
      "  zero = 0,\n"
      "  'stray',\n"
      "}");
  EXPECT_NE(e.find("s.lua:2: gradient_accumulation_steps: must be an integer, got a string"),
            std::string::npos) << e;
  EXPECT_NE(e.find("s.lua:3: optimizer.betas: must be a list of 2 numbers, got 1"),
            std::string::npos) << e;
  EXPECT_NE(e.find("s.lua:4: fp16: loss-scaling settings are given but precision is \"fp32\""),
            std::string::npos) << e;
  EXPECT_NE(e.find("s.lua:5: zero: must be a table, got a number"), std::string::npos) << e;
  EXPECT_NE(e.find("unexpected list entry [1]"), std::string::npos) << e;
}

// A timeout too large for a deadline's nanoseconds is refused, not taken:
// 1e12 s used to wrap each deadline into the past, so every wait failed at
// once ("waited 0.0 s (the job's comm timeout)"). 0 is forever.
TEST_F(ScriptTest, ACommTimeoutBeyondADeadlinesRangeIsRefused) {
  const std::string e = error_of("return {\n  comm = { timeout = 1e12 },\n}");
  EXPECT_NE(e.find("s.lua:2: comm.timeout"), std::string::npos) << e;
  EXPECT_NE(e.find("must be <= 10000000"), std::string::npos) << e;
  EXPECT_EQ(error_of("return { comm = { timeout = 0 } }"), "");
  EXPECT_EQ(error_of("return { comm = { timeout = 1e7 } }"), "");
}
