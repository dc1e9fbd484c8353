// The host tier: memory on the rank's NUMA node. On this machine, and on a
// synthetic 2-socket, 4-node machine described by an XML file that hwloc
// loads through HWLOC_XMLFILE.
#include <hwloc.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tier_plugin.h"

namespace zerod::offload::test {
namespace {

using ::testing::HasSubstr;

class HostTier : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NE(plugin_.desc(), nullptr) << plugin_.error(); }

  std::vector<double> values(double numa_node = -1, double pin = 1, double huge_pages = 1) const {
    std::vector<double> v = plugin_.defaults();
    v[plugin_.offset_of("numa_node")] = numa_node;
    v[plugin_.offset_of("pin")] = pin;
    v[plugin_.offset_of("huge_pages")] = huge_pages;
    return v;
  }

  TierPlugin plugin_{"host"};
};

TEST_F(HostTier, DescriptorIsAnAddressableTier) {
  const zd_tier_v1* d = plugin_.desc();
  EXPECT_STREQ(d->header.name, "host");
  EXPECT_EQ(d->header.struct_size, sizeof(zd_tier_v1));
  ASSERT_NE(d->allocate, nullptr);
  ASSERT_NE(d->release, nullptr);
  EXPECT_EQ(d->reserve, nullptr);
  EXPECT_EQ(d->submit, nullptr);
  EXPECT_EQ(d->wait, nullptr);
  EXPECT_EQ(d->alignment, nullptr);
  const zd_tier_config c = make_config(0, 0);
  Tier t(plugin_, values(), c);
  ASSERT_EQ(t.status(), ZD_OK) << t.error();
  EXPECT_EQ(d->capabilities(t.get()), static_cast<uint32_t>(ZD_TIER_CAP_ADDRESSABLE));
}

TEST_F(HostTier, AllocatesZeroedAlignedMemoryAndReleasesIt) {
  const zd_tier_config c = make_config(0, 0);
  Tier t(plugin_, values(), c);
  ASSERT_EQ(t.status(), ZD_OK) << t.error();
  for (uint64_t bytes : {uint64_t{0}, uint64_t{1}, uint64_t{63}, uint64_t{4096}, uint64_t{1} << 20,
                         (uint64_t{3} << 20) + 17}) {
    char err[256] = "";
    auto* p = static_cast<unsigned char*>(t.desc()->allocate(t.get(), bytes, err, sizeof err));
    ASSERT_NE(p, nullptr) << bytes << ": " << err;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << bytes;
    uint64_t nonzero = 0;
    for (uint64_t i = 0; i < bytes; ++i) nonzero += p[i] != 0;
    EXPECT_EQ(nonzero, 0u) << bytes;
    for (uint64_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(i);  // writable
    t.desc()->release(t.get(), p, bytes);
  }
  t.desc()->release(t.get(), nullptr, 0);  // a no-op
}

TEST_F(HostTier, AnImpossibleAllocationFailsNamingBytesAndNode) {
  const zd_tier_config c = make_config(0, 0);
  Tier t(plugin_, values(), c);
  ASSERT_EQ(t.status(), ZD_OK) << t.error();
  char err[256] = "";
  EXPECT_EQ(t.desc()->allocate(t.get(), uint64_t{1} << 62, err, sizeof err), nullptr);
  EXPECT_THAT(err, HasSubstr("4611686018427387904 bytes"));
  EXPECT_THAT(err, HasSubstr("NUMA node 0"));
}

TEST_F(HostTier, ThisMachineIsBoundAndNotPageLockedWithoutAGpu) {
  const zd_tier_config c = make_config(0, 0);
  Tier t(plugin_, values(), c);
  ASSERT_EQ(t.status(), ZD_OK) << t.error();
  char err[256] = "";
  void* p = t.desc()->allocate(t.get(), 1 << 20, err, sizeof err);
  ASSERT_NE(p, nullptr) << err;
  const std::string d = t.describe();
  EXPECT_THAT(d, HasSubstr("host: NUMA node 0 of "));
  EXPECT_THAT(d, HasSubstr(", bound, "));
  // Machines where this runs have no GPU; with one it says page-locked.
  EXPECT_THAT(d, ::testing::AnyOf(HasSubstr("not page-locked: no GPU"), HasSubstr("built without CUDA"),
                                  HasSubstr(", page-locked")));
  t.desc()->release(t.get(), p, 1 << 20);

  const std::vector<int32_t> cpus = t.cpus();
  EXPECT_FALSE(cpus.empty());
  for (int32_t cpu : cpus) EXPECT_LT(cpu, sysconf(_SC_NPROCESSORS_CONF));
  EXPECT_EQ(t.desc()->cpus(t.get(), nullptr, 0), static_cast<int32_t>(cpus.size()));
  int32_t one = -1;
  EXPECT_EQ(t.desc()->cpus(t.get(), &one, 1), 1);
  EXPECT_EQ(one, cpus[0]);
}

TEST_F(HostTier, PinFalseIsSaid) {
  const zd_tier_config c = make_config(0, 0);
  Tier t(plugin_, values(-1, 0), c);
  ASSERT_EQ(t.status(), ZD_OK) << t.error();
  EXPECT_THAT(t.describe(), HasSubstr("not page-locked: pin = false"));
}

TEST_F(HostTier, RefusesBadValues) {
  const zd_tier_config c = make_config(0, 0);
  {
    Tier t(plugin_, values(-2), c);
    EXPECT_EQ(t.status(), ZD_ERR_CONFIG);
    EXPECT_THAT(t.error(), HasSubstr("numa_node = -2"));
  }
  {
    Tier t(plugin_, values(0.5), c);
    EXPECT_EQ(t.status(), ZD_ERR_CONFIG);
  }
  {
    Tier t(plugin_, {}, c);
    EXPECT_EQ(t.status(), ZD_ERR_INVALID_ARGUMENT);
    EXPECT_THAT(t.error(), HasSubstr("expected 3 hyperparameter values"));
  }
}

constexpr uint64_t kHugePage = uint64_t{2} << 20;

// The kernel's THP mode, the bracketed word ("madvise"); "" without THP.
std::string thp_mode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(f, line);
  const size_t open = line.find('['), close = line.find(']');
  return open == std::string::npos || close == std::string::npos ? "" : line.substr(open + 1, close - open - 1);
}

// The value of `field` ("THPeligible") in /proc/self/smaps for the mapping
// holding p; -1 when the kernel does not print it.
long smaps_field(const void* p, const std::string& field) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2) {  // a mapping's first line; no field parses so
      inside = lo <= at && at < hi;
    } else if (inside && line.rfind(field + ":", 0) == 0) {
      return std::strtol(line.c_str() + field.size() + 1, nullptr, 10);
    }
  }
  return -1;
}

// False where this process may not have huge pages whatever it advises
// (prctl PR_SET_THP_DISABLE, as some containers set).
bool thp_allowed_here() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("THP_enabled:", 0) == 0) return line.find('1') != std::string::npos;
  return true;
}

TEST_F(HostTier, LargeAllocationsAskForHugePagesUnlessTurnedOff) {
  const zd_tier_config c = make_config(0, 0);
  const std::string mode = thp_mode();
  // THPeligible is in smaps from Linux 5.0 (-1 before): the advice itself is
  // then unseen, and the alignment and the log line are what is checked.
  const bool seen = smaps_field(&mode, "THPeligible") >= 0 && thp_allowed_here();
  const uint64_t bytes = (uint64_t{5} << 20) + 100;  // not a whole number of huge pages
  for (const bool huge : {true, false}) {
    Tier t(plugin_, values(-1, 1, huge ? 1 : 0), c);
    ASSERT_EQ(t.status(), ZD_OK) << t.error();
    char err[256] = "";
    auto* p = static_cast<unsigned char*>(t.desc()->allocate(t.get(), bytes, err, sizeof err));
    ASSERT_NE(p, nullptr) << err;
    if (huge) {
      // Aligned, so the first 2 MiB of the request can be one huge page.
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHugePage, 0u);
      if (mode == "always" || mode == "madvise") {
        if (seen) {
          EXPECT_EQ(smaps_field(p, "THPeligible"), 1) << "THP mode " << mode;
        }
        EXPECT_THAT(t.describe(), HasSubstr("huge pages for allocations of 2 MiB or more (THP " + mode + ")"));
      } else {
        EXPECT_THAT(t.describe(), HasSubstr("4 KiB pages: "));
      }
    } else {
      // Advised off: 4 KiB pages even where the kernel's mode is always.
      if (seen) {
        EXPECT_EQ(smaps_field(p, "THPeligible"), 0);
      }
      EXPECT_THAT(t.describe(), HasSubstr("4 KiB pages: huge_pages = false"));
    }
    // The whole request is there, zeroed and writable, to its last byte.
    EXPECT_EQ(p[bytes - 1], 0);
    for (uint64_t i = 0; i < bytes; i += 4096) p[i] = 1;
    p[bytes - 1] = 1;
    t.desc()->release(t.get(), p, bytes);
  }
  {
    Tier t(plugin_, values(-1, 1, 0.5), c);
    EXPECT_EQ(t.status(), ZD_ERR_CONFIG);
    EXPECT_THAT(t.error(), HasSubstr("huge_pages = 0.5: must be a bool"));
  }
}

TEST_F(HostTier, ConcurrentAllocationsAreSafe) {
  const zd_tier_config c = make_config(0, 0);
  Tier t(plugin_, values(), c);
  ASSERT_EQ(t.status(), ZD_OK) << t.error();
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&t, k] {
      for (int i = 0; i < 50; ++i) {
        const uint64_t bytes = static_cast<uint64_t>(4096 * (1 + (i + k) % 7));
        char err[256] = "";
        auto* p = static_cast<unsigned char*>(t.desc()->allocate(t.get(), bytes, err, sizeof err));
        ASSERT_NE(p, nullptr) << err;
        EXPECT_EQ(p[bytes - 1], 0);
        p[0] = 1;
        t.desc()->release(t.get(), p, bytes);
      }
    });
  }
  for (auto& th : threads) th.join();
}

// A machine of two packages with two NUMA nodes each, four single-PU cores
// per node, exported to XML at test time and loaded through HWLOC_XMLFILE.
class SyntheticMachine : public HostTier {
 protected:
  static void SetUpTestSuite() {
    char dir[] = "/tmp/zerod-hwloc-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    xml_ = dir_ + "/machine.xml";
    hwloc_topology_t topo;
    ASSERT_EQ(hwloc_topology_init(&topo), 0);
    ASSERT_EQ(hwloc_topology_set_synthetic(topo, "pack:2 numa:2 core:4 pu:1"), 0);
    ASSERT_EQ(hwloc_topology_load(topo), 0);
    ASSERT_EQ(hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE), 4);
    ASSERT_EQ(hwloc_topology_export_xml(topo, xml_.c_str(), 0), 0);
    hwloc_topology_destroy(topo);
  }
  static void TearDownTestSuite() {
    unlink(xml_.c_str());
    rmdir(dir_.c_str());
  }
  void SetUp() override {
    HostTier::SetUp();
    const char* old = std::getenv("HWLOC_XMLFILE");
    had_old_ = old != nullptr;
    if (had_old_) old_ = old;
    ASSERT_EQ(setenv("HWLOC_XMLFILE", xml_.c_str(), 1), 0);
  }
  void TearDown() override {
    if (had_old_) {
      setenv("HWLOC_XMLFILE", old_.c_str(), 1);
    } else {
      unsetenv("HWLOC_XMLFILE");
    }
  }

  static std::string dir_, xml_;
  bool had_old_ = false;
  std::string old_;
};

std::string SyntheticMachine::dir_;
std::string SyntheticMachine::xml_;

TEST_F(SyntheticMachine, RanksSpreadOverTheNodesAndGetTheirCpus) {
  for (int32_t rank = 0; rank < 4; ++rank) {
    const zd_tier_config c = make_config(rank + 8, rank);  // local_rank decides, not rank
    Tier t(plugin_, values(), c);
    ASSERT_EQ(t.status(), ZD_OK) << t.error();
    EXPECT_THAT(t.describe(), HasSubstr("host: NUMA node " + std::to_string(rank) + " of 4 (cpus " +
                                        std::to_string(4 * rank) + "-" + std::to_string(4 * rank + 3) + ")"));
    const std::vector<int32_t> want = {4 * rank, 4 * rank + 1, 4 * rank + 2, 4 * rank + 3};
    EXPECT_EQ(t.cpus(), want) << "local rank " << rank;
  }
  const zd_tier_config c = make_config(0, 6);
  Tier t(plugin_, values(), c);
  ASSERT_EQ(t.status(), ZD_OK) << t.error();
  EXPECT_THAT(t.describe(), HasSubstr("NUMA node 2 of 4"));
}

TEST_F(SyntheticMachine, AnExplicitNodeIsHonoured) {
  const zd_tier_config c = make_config(0, 0);
  Tier t(plugin_, values(3), c);
  ASSERT_EQ(t.status(), ZD_OK) << t.error();
  EXPECT_THAT(t.describe(), HasSubstr("NUMA node 3 of 4 (cpus 12-15)"));
  const std::vector<int32_t> want = {12, 13, 14, 15};
  EXPECT_EQ(t.cpus(), want);
}

TEST_F(SyntheticMachine, ANodeNotOnTheMachineIsRefused) {
  const zd_tier_config c = make_config(0, 0);
  Tier t(plugin_, values(9), c);
  EXPECT_EQ(t.status(), ZD_ERR_CONFIG);
  EXPECT_THAT(t.error(), HasSubstr("numa_node = 9"));
  EXPECT_THAT(t.error(), HasSubstr("4 NUMA nodes"));
}

TEST_F(SyntheticMachine, MemoryIsOnlyIntendedForANodeOfAnotherMachine) {
  const zd_tier_config c = make_config(0, 1);
  Tier t(plugin_, values(), c);
  ASSERT_EQ(t.status(), ZD_OK) << t.error();
  char err[256] = "";
  auto* p = static_cast<unsigned char*>(t.desc()->allocate(t.get(), 1 << 20, err, sizeof err));
  ASSERT_NE(p, nullptr) << err;
  EXPECT_EQ(p[12345], 0);
  t.desc()->release(t.get(), p, 1 << 20);
  const std::string d = t.describe();
  EXPECT_THAT(d, HasSubstr("NUMA node 1 of 4"));
  EXPECT_THAT(d, HasSubstr("intended: topology from HWLOC_XMLFILE, not this machine"));
  EXPECT_THAT(d, ::testing::Not(HasSubstr(", bound")));
}

TEST_F(SyntheticMachine, AnUnreadableXmlFileIsAnError) {
  const std::string missing = dir_ + "/no-such-machine.xml";
  ASSERT_EQ(setenv("HWLOC_XMLFILE", missing.c_str(), 1), 0);
  const zd_tier_config c = make_config(0, 0);
  Tier t(plugin_, values(), c);
  EXPECT_EQ(t.status(), ZD_ERR_CONFIG);
  EXPECT_THAT(t.error(), HasSubstr("HWLOC_XMLFILE=" + missing));
}

// The same machine with a GPU (a PCI device behind a bridge) attached to
// NUMA node 2's group, as hwloc records a GPU local to one socket's node.
// ZEROD_DEVICE_PCI_BUS_IDS stands in for CUDA naming the rank's device.
class GpuMachine : public SyntheticMachine {
 protected:
  static void SetUpTestSuite() {
    SyntheticMachine::SetUpTestSuite();
    std::ifstream in(xml_);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    const size_t numa = text.find("type=\"NUMANode\" os_index=\"2\"");
    ASSERT_NE(numa, std::string::npos);
    const size_t group = text.rfind("<object type=\"Group\"", numa);
    ASSERT_NE(group, std::string::npos);
    const size_t line = text.rfind('\n', group) + 1;
    const std::string indent = text.substr(line, group - line);
    const size_t close = text.find("\n" + indent + "</object>", numa);
    ASSERT_NE(close, std::string::npos);
    text.insert(close + 1, indent + "  <object type=\"Bridge\" os_index=\"0\" gp_index=\"900\" bridge_type=\"0-1\" "
                               "depth=\"0\" bridge_pci=\"0000:[40-41]\">\n" +
                               indent + "    <object type=\"PCIDev\" os_index=\"266240\" gp_index=\"901\" "
                               "pci_busid=\"0000:41:00.0\" pci_type=\"0302 [10de:2330] [10de:16c1] a1\" "
                               "pci_link_speed=\"0.000000\"/>\n" +
                               indent + "  </object>\n");
    std::ofstream(xml_) << text;
  }
  void SetUp() override {
    SyntheticMachine::SetUp();
    ASSERT_EQ(setenv("ZEROD_DEVICE_PCI_BUS_IDS", "0000:41:00.0", 1), 0);
  }
  void TearDown() override {
    unsetenv("ZEROD_DEVICE_PCI_BUS_IDS");
    SyntheticMachine::TearDown();
  }
};

TEST_F(GpuMachine, TheNodeNearestTheRanksDeviceIsChosen) {
  for (int32_t local_rank : {0, 3}) {
    const zd_tier_config c = make_config(local_rank, local_rank);
    Tier t(plugin_, values(), c);
    ASSERT_EQ(t.status(), ZD_OK) << t.error();
    EXPECT_THAT(t.describe(), HasSubstr("NUMA node 2 of 4 (cpus 8-11), by nearest device 0000:41:00.0"));
    const std::vector<int32_t> want = {8, 9, 10, 11};
    EXPECT_EQ(t.cpus(), want);
  }
}

TEST_F(GpuMachine, DevicesAreTakenByLocalRank) {
  ASSERT_EQ(setenv("ZEROD_DEVICE_PCI_BUS_IDS", "0000:99:00.0, 0000:41:00.0", 1), 0);
  const zd_tier_config c1 = make_config(1, 1);
  Tier t1(plugin_, values(), c1);
  ASSERT_EQ(t1.status(), ZD_OK) << t1.error();
  EXPECT_THAT(t1.describe(), HasSubstr("NUMA node 2 of 4 (cpus 8-11), by nearest device 0000:41:00.0"));
  // Local rank 0's device is not on this machine: the rule for CPU ranks,
  // and the log says why.
  const zd_tier_config c0 = make_config(0, 0);
  Tier t0(plugin_, values(), c0);
  ASSERT_EQ(t0.status(), ZD_OK) << t0.error();
  EXPECT_THAT(t0.describe(),
              HasSubstr("NUMA node 0 of 4 (cpus 0-3), by local rank 0 (device 0000:99:00.0 is not in the topology)"));
}

TEST_F(GpuMachine, AnExplicitNodeWinsOverTheDevice) {
  const zd_tier_config c = make_config(0, 0);
  Tier t(plugin_, values(1), c);
  ASSERT_EQ(t.status(), ZD_OK) << t.error();
  EXPECT_THAT(t.describe(), HasSubstr("NUMA node 1 of 4 (cpus 4-7), by numa_node = 1"));
}

}  // namespace
}  // namespace zerod::offload::test
