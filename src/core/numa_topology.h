// Where worker threads run and which part of the work (and of the weights) each NUMA node owns, for machines of
// 64-192 cores on 1-2 nodes (issue "Speed to the machine's limits", target 7; DESIGN.md "Speed").
//
//   NumaTopology     the nodes and their CPUs, read from sysfs (/sys/devices/system/node/node<N>/cpulist) or
//                    from a directory laid out the same way (tests simulate a 2-node machine that way).
//   ThreadPlacement  thread index -> (node, cpu): threads are given to nodes in proportion to their CPUs, as
//                    contiguous index ranges (thread 0, the caller, on node 0), one CPU each, so a pool can pin
//                    them (pin_current_thread) and a kernel knows the node of every thread index.
//   node_row_ranges  a matmul's output rows split into one contiguous range per node in proportion to its threads
//                    (multiples of `grain` rows): the threads of a node split only their node's range, so each
//                    weight row is read by one node only, and placing (first-touching, or repacking) a node's rows
//                    from a thread of that node puts them in its local memory.
// Policy and storage only: nothing here runs a kernel.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace dsflash {

struct NumaTopology {
  std::vector<std::vector<int>> node_cpus;  // [nodes] sorted CPU ids

  // Reads `root`/node<N>/cpulist for N = 0, 1, ... (stops at the first missing node). Error when there is no
  // node0 or a cpulist is malformed. A machine without the directory is one node with `fallback_cpus` CPUs.
  static Result<NumaTopology> from_sysfs(const std::string& root = "/sys/devices/system/node", int fallback_cpus = 0);
  // "0-3,8-11" -> {0, 1, 2, 3, 8, 9, 10, 11}. Error names the bad piece.
  static Result<std::vector<int>> parse_cpulist(const std::string& text);

  int num_nodes() const { return static_cast<int>(node_cpus.size()); }
  int num_cpus() const;
};

struct ThreadPlacement {
  std::vector<int> node_of_thread;  // [threads]
  std::vector<int> cpu_of_thread;   // [threads]
  std::vector<int> first_thread;    // [nodes + 1]: node n owns threads [first_thread[n], first_thread[n + 1])
  int num_threads() const { return static_cast<int>(node_of_thread.size()); }
  int num_nodes() const { return static_cast<int>(first_thread.size()) - 1; }
};

// num_threads >= 1 (more threads than CPUs reuse CPUs round robin within the node).
ThreadPlacement place_threads(const NumaTopology& topology, int num_threads);

struct RowRange {
  int64_t begin = 0, end = 0;
};
// [nodes] ranges covering [0, rows) in node order, each a multiple of grain except the last non-empty one.
std::vector<RowRange> node_row_ranges(int64_t rows, const ThreadPlacement& placement, int64_t grain = 1);
// Node `node`'s range of node_row_ranges, from first_thread ([nodes + 1], ThreadPlacement::first_thread), without
// allocating (ThreadPool::parallel_for_nodes splits every job with it).
RowRange node_row_range(int64_t rows, const std::vector<int>& first_thread, int node, int64_t grain = 1);

// Pins the calling thread to `cpu` (false when the OS refuses, e.g. the CPU is outside the process's mask).
bool pin_current_thread(int cpu);

}  // namespace dsflash
