// The Lua host's parts: the source map, size literals, number formatting,
// and the schedule library (golden values after DeepSpeed's scheduler tests).
#include "config_reader.h"
#include "sandbox.h"
#include "size.h"
#include "source_map.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace zerod::scripting;

TEST(SourceMap, RecordsNestedKeysWithTheirLines) {
  SourceMap m(
      "-- a comment with optimizer = {\n"
      "local zerod = require('zerod')\n"
      "return {\n"
      "  optimizer = {\n"
      "    type = 'adamw', lr = 1e-3,\n"
      "    betas = { 0.9, 0.95 },\n"
      "  },\n"
      "  [\"zero\"] = { stage = 2 },\n"
      "  s = [[ long\n string x = 1 ]],\n"
      "  lr = function(step) local y = 2 if step == 1 then y = 3 end return y end,\n"
      "  after = 1,\n"
      "}\n");
  EXPECT_EQ(m.line_of("optimizer"), 4);
  EXPECT_EQ(m.line_of("optimizer.type"), 5);
  EXPECT_EQ(m.line_of("optimizer.lr"), 5);
  EXPECT_EQ(m.line_of("optimizer.betas"), 6);
  EXPECT_EQ(m.line_of("zero.stage"), 8);
  EXPECT_EQ(m.line_of("after"), 12);  // long strings and function bodies counted right
  EXPECT_EQ(m.line_of("y"), 0);       // a local inside a function is not a field
  EXPECT_EQ(m.line_of("x"), 0);       // text inside a long string is not a field
  EXPECT_EQ(m.line_of("nothing"), 0);
  EXPECT_EQ(m.return_line(), 3);
}

TEST(SourceMap, FallsBackToTheLongestSuffix) {
  SourceMap m("local o = {\n lr = 1 }\nreturn { optimizer = o, x = { lr = 2 } }\n");
  EXPECT_EQ(m.line_of("optimizer.lr"), 2);  // only "lr" is recorded for the local
  EXPECT_EQ(m.line_of("x.lr"), 3);          // the exact path wins over "lr"
}

TEST(Size, Literals) {
  EXPECT_EQ(parse_size("4096"), 4096u);
  EXPECT_EQ(parse_size("512MiB"), 512u << 20);
  EXPECT_EQ(parse_size("1.5 GiB"), 3u << 29);
  EXPECT_EQ(parse_size("4GB"), 4000000000u);
  EXPECT_EQ(parse_size("2 KiB "), 2048u);
  EXPECT_FALSE(parse_size("4G"));  // binary or decimal? refused
  EXPECT_FALSE(parse_size("-1MiB"));
  EXPECT_FALSE(parse_size("1.5B"));  // not a whole number of bytes
  EXPECT_FALSE(parse_size("lots"));
}

TEST(FormatNumber, ShortestRoundTrip) {
  EXPECT_EQ(format_number(0.001), "0.001");
  EXPECT_EQ(format_number(3e-4), "0.0003");
  EXPECT_EQ(format_number(0.999), "0.999");
  EXPECT_EQ(format_number(1e-8), "1e-08");
  EXPECT_EQ(format_number(16), "16");
}

// Evaluates a schedule expression at the given steps.
static std::vector<double> schedule(const std::string& expr, std::vector<int> steps) {
  Sandbox sb(SandboxLimits{});
  std::string err;
  EXPECT_TRUE(sb.load("return " + expr, "=t", &err)) << err;
  EXPECT_TRUE(sb.call(0, 1, &err)) << err;
  std::vector<double> out;
  for (int s : steps) {
    lua_pushvalue(sb.L(), -1);
    lua_pushinteger(sb.L(), s);
    EXPECT_TRUE(sb.call(1, 1, &err)) << err;
    out.push_back(lua_tonumber(sb.L(), -1));
    lua_pop(sb.L(), 1);
  }
  return out;
}

TEST(Schedules, WarmupLinear) {
  const auto v = schedule("zerod.warmup_linear{ warmup_steps = 10, max_lr = 1.0, min_lr = 0.1 }",
                          {0, 5, 10, 100});
  EXPECT_DOUBLE_EQ(v[0], 0.1);  // lr[0] = min
  EXPECT_DOUBLE_EQ(v[1], 0.55);
  EXPECT_DOUBLE_EQ(v[2], 1.0);  // lr[W] = max
  EXPECT_DOUBLE_EQ(v[3], 1.0);  // constant after
  const auto lg = schedule("zerod.warmup_linear{ warmup_steps = 10, max_lr = 1, warmup_type = 'log' }",
                           {0, 9});
  EXPECT_DOUBLE_EQ(lg[0], 0.0);
  EXPECT_DOUBLE_EQ(lg[1], 1.0);  // log warm-up reaches 1 at W-1
}

TEST(Schedules, WarmupDecayFallsStrictlyAfterWarmup) {
  const auto v = schedule("zerod.warmup_decay{ warmup_steps = 5, total_steps = 25, max_lr = 1 }",
                          {0, 5, 10, 15, 20, 25, 30});
  EXPECT_DOUBLE_EQ(v[1], 1.0);
  for (size_t i = 2; i < 6; ++i) EXPECT_LT(v[i], v[i - 1]);
  EXPECT_DOUBLE_EQ(v[2], 0.75);
  EXPECT_DOUBLE_EQ(v[5], 0.0);
  EXPECT_DOUBLE_EQ(v[6], 0.0);
  // total_steps <= warmup_steps: DeepSpeed's WarmupDecayLR takes it (it
  // warns) and holds min_lr after the warm-up; it was refused here, and a
  // DeepSpeed config of warmup_num_steps 1, total_num_steps 2 with it.
  const auto short_total = schedule("zerod.warmup_decay{ warmup_steps = 4, total_steps = 3, max_lr = 1, min_lr = 0.5 }",
                                    {0, 2, 4, 9});
  EXPECT_DOUBLE_EQ(short_total[0], 0.5);
  EXPECT_DOUBLE_EQ(short_total[1], 0.75);
  EXPECT_DOUBLE_EQ(short_total[2], 0.5);
  EXPECT_DOUBLE_EQ(short_total[3], 0.5);
}

TEST(Schedules, CosineEndsAtTheMinimum) {
  const auto v = schedule(
      "zerod.cosine{ warmup_steps = 4, total_steps = 14, max_lr = 2, min_lr = 0.2 }",
      {0, 2, 4, 9, 14, 20});
  EXPECT_DOUBLE_EQ(v[0], 0.2);
  EXPECT_DOUBLE_EQ(v[1], 1.1);
  EXPECT_DOUBLE_EQ(v[2], 2.0);
  EXPECT_NEAR(v[3], 1.1, 1e-12);  // halfway down the cosine
  EXPECT_NEAR(v[4], 0.2, 1e-12);
  EXPECT_NEAR(v[5], 0.2, 1e-12);
}

TEST(Schedules, OneCycleGoesUpDownThenDecays) {
  const auto v = schedule(
      "zerod.one_cycle{ min_lr = 0.1, max_lr = 1.0, first_steps = 10, decay_rate = 1,"
      " decay_steps = 10 }",
      {0, 5, 10, 15, 20, 30});
  EXPECT_DOUBLE_EQ(v[0], 0.1);   // lr[0] = min
  EXPECT_DOUBLE_EQ(v[1], 0.55);
  EXPECT_DOUBLE_EQ(v[2], 1.0);   // lr[first_steps] = max
  EXPECT_DOUBLE_EQ(v[3], 0.55);
  EXPECT_DOUBLE_EQ(v[4], 0.1);   // back at min when the cycle ends
  EXPECT_DOUBLE_EQ(v[5], 0.05);  // min / (1 + 1 * 10 / 10)
}

TEST(Schedules, OneCycleStairsAsDeepSpeedMakesThem) {
  // Two stairs up, four down (DeepSpeed's cycle_first/second_stair_count):
  // the lr moves only where a stair begins.
  const auto v = schedule(
      "zerod.one_cycle{ min_lr = 0, max_lr = 1, first_steps = 4, first_stairs = 2, second_stairs = 4 }",
      {0, 1, 2, 3, 4, 5, 6, 7, 8});
  EXPECT_EQ(v, (std::vector<double>{0, 0, 0.5, 0.5, 1, 0.75, 0.5, 0.25, 0}));
  // second_stairs defaults to first_stairs, as in DeepSpeed.
  EXPECT_EQ(schedule("zerod.one_cycle{ min_lr = 0, max_lr = 1, first_steps = 4, first_stairs = 2 }", {5, 6}),
            (std::vector<double>{0.5, 0.5}));
  // An uneven cycle: at its top the ramp's factor is 1 - 1e-16, and a
  // floor() of it would drop a whole stair; the stair is from the step count.
  EXPECT_EQ(schedule("zerod.one_cycle{ min_lr = 0, max_lr = 1, first_steps = 3, second_steps = 7,"
                     " first_stairs = 3, second_stairs = 3 }", {3})[0], 1.0);
}

TEST(Schedules, BadArgumentsAreRefused) {
  Sandbox sb(SandboxLimits{});
  std::string err;
  // Not `return zerod.f{...}`: a tail call leaves no caller line to blame.
  ASSERT_TRUE(sb.load("local s = zerod.warmup_decay{ warmup_steps = 5, total_steps = -5, max_lr = 1 }"
                      " return s", "@x.lua", &err));
  EXPECT_FALSE(sb.call(0, 1, &err));
  EXPECT_NE(err.find("x.lua:1: zerod.warmup_decay: total_steps"), std::string::npos) << err;
  ASSERT_TRUE(sb.load("local s = zerod.cosine{ total_steps = 5, max_lr = -1 } return s", "@x.lua", &err));
  EXPECT_FALSE(sb.call(0, 1, &err));
  EXPECT_NE(err.find("max_lr must be >= 0"), std::string::npos) << err;
  ASSERT_TRUE(sb.load("return zerod.size('1MiB') + zerod.GiB", "=t", &err));
  ASSERT_TRUE(sb.call(0, 1, &err)) << err;
  EXPECT_EQ(lua_tointeger(sb.L(), -1), (1 << 20) + (1 << 30));
}
