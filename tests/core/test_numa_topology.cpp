// NUMA placement under a simulated topology (a sysfs-shaped directory): cpulist parsing, threads given to nodes in
// proportion to their CPUs as contiguous index ranges, a matmul's rows split per node on the grain, and pinning.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "core/numa_topology.h"

namespace dsflash {
namespace {

class SimulatedNodes : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() / ("dsflash_numa_" + std::to_string(::getpid()));
    std::filesystem::remove_all(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void node(int n, const std::string& cpulist) {
    std::filesystem::create_directories(root_ / ("node" + std::to_string(n)));
    std::ofstream(root_ / ("node" + std::to_string(n)) / "cpulist") << cpulist << "\n";
  }
  std::filesystem::path root_;
};

TEST(NumaTopology, ParsesCpulists) {
  auto cpus = NumaTopology::parse_cpulist("0-3,8-9,12");
  ASSERT_TRUE(cpus.ok());
  EXPECT_EQ(*cpus, (std::vector<int>{0, 1, 2, 3, 8, 9, 12}));
  EXPECT_TRUE(NumaTopology::parse_cpulist("").ok());
  for (const char* bad : {"0-a", "3-1", "-2", "1,,x", "4-"}) {
    EXPECT_FALSE(NumaTopology::parse_cpulist(bad).ok()) << bad;
  }
}

TEST_F(SimulatedNodes, TwoNodesGetThreadsAndRowsInProportion) {
  node(0, "0-3");
  node(1, "4-7");
  auto topology = NumaTopology::from_sysfs(root_.string());
  ASSERT_TRUE(topology.ok()) << topology.status().message();
  ASSERT_EQ(topology->num_nodes(), 2);
  const ThreadPlacement eight = place_threads(*topology, 8);
  EXPECT_EQ(eight.node_of_thread, (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(eight.cpu_of_thread, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(eight.first_thread, (std::vector<int>{0, 4, 8}));
  const ThreadPlacement three = place_threads(*topology, 3);
  EXPECT_EQ(three.first_thread, (std::vector<int>{0, 2, 3}));
  const ThreadPlacement twelve = place_threads(*topology, 12);  // more threads than CPUs: CPUs reused in the node
  EXPECT_EQ(twelve.first_thread, (std::vector<int>{0, 6, 12}));
  EXPECT_EQ(twelve.cpu_of_thread[4], 0);
  for (int64_t rows : {1, 15, 16, 1000, 4096}) {
    for (int64_t grain : {1, 16, 64}) {
      const auto ranges = node_row_ranges(rows, eight, grain);
      ASSERT_EQ(ranges.size(), 2u);
      EXPECT_EQ(ranges[0].begin, 0);
      EXPECT_EQ(ranges[0].end, ranges[1].begin);
      EXPECT_EQ(ranges[1].end, rows);
      EXPECT_TRUE(ranges[0].end % grain == 0 || ranges[0].end == rows) << rows << " " << grain;
      // Equal threads: the first node's share within one grain of half.
      EXPECT_LE(std::abs(ranges[0].end - rows / 2), grain) << rows << " " << grain;
    }
  }
  const auto uneven = node_row_ranges(900, three, 1);
  EXPECT_EQ(uneven[0].end, 600);  // 2 of 3 threads on node 0
}

TEST_F(SimulatedNodes, MemoryOnlyNodesAndBadFilesAndNoSysfs) {
  node(0, "0-1");
  node(1, "");  // memory only (e.g. CXL): no threads there
  node(2, "2-3");
  auto topology = NumaTopology::from_sysfs(root_.string());
  ASSERT_TRUE(topology.ok());
  EXPECT_EQ(topology->num_nodes(), 2);
  node(3, "x");
  auto bad = NumaTopology::from_sysfs(root_.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("node3"), std::string::npos) << bad.status().message();
  auto none = NumaTopology::from_sysfs((root_ / "missing").string(), 6);
  ASSERT_TRUE(none.ok());
  ASSERT_EQ(none->num_nodes(), 1);
  EXPECT_EQ(none->num_cpus(), 6);
}

TEST(NumaTopology, PinsAThreadToAnAllowedCpu) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &allowed)) ++cpu;
  ASSERT_LT(cpu, CPU_SETSIZE);
  bool pinned = false;
  int ran_on = -1;
  std::thread t([&] {
    pinned = pin_current_thread(cpu);
    ran_on = sched_getcpu();
  });
  t.join();
  EXPECT_TRUE(pinned);
  EXPECT_EQ(ran_on, cpu);
  EXPECT_FALSE(pin_current_thread(-1));
}

}  // namespace
}  // namespace dsflash
