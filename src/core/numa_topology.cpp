#include "core/numa_topology.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace dsflash {

Result<std::vector<int>> NumaTopology::parse_cpulist(const std::string& text) {
  std::vector<int> cpus;
  std::stringstream in(text);
  std::string piece;
  while (std::getline(in, piece, ',')) {
    piece.erase(std::remove_if(piece.begin(), piece.end(), [](char c) { return c == ' ' || c == '\n'; }), piece.end());
    if (piece.empty()) continue;
    const size_t dash = piece.find('-');
    try {
      size_t used = 0;
      const int first = std::stoi(piece.substr(0, dash), &used);
      if (used != (dash == std::string::npos ? piece.size() : dash)) throw std::invalid_argument(piece);
      int last = first;
      if (dash != std::string::npos) {
        const std::string tail = piece.substr(dash + 1);
        last = std::stoi(tail, &used);
        if (used != tail.size()) throw std::invalid_argument(piece);
      }
      if (first < 0 || last < first) throw std::invalid_argument(piece);
      for (int c = first; c <= last; ++c) cpus.push_back(c);
    } catch (const std::exception&) {
      return Status::Error("cpulist: bad piece '" + piece + "' in '" + text + "'");
    }
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

Result<NumaTopology> NumaTopology::from_sysfs(const std::string& root, int fallback_cpus) {
  NumaTopology topology;
  std::error_code ec;
  if (!std::filesystem::is_directory(root, ec)) {
    std::vector<int> all(static_cast<size_t>(std::max(1, fallback_cpus)));
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
    topology.node_cpus.push_back(all);
    return topology;
  }
  for (int node = 0;; ++node) {
    const std::string path = root + "/node" + std::to_string(node) + "/cpulist";
    std::ifstream in(path);
    if (!in) break;
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto cpus = parse_cpulist(text);
    if (!cpus.ok()) return cpus.status().with_context(path);
    if (cpus->empty()) continue;  // a memory-only node: no threads go there
    topology.node_cpus.push_back(std::move(*cpus));
  }
  if (topology.node_cpus.empty()) return Status::Error(root + ": no node with CPUs (node0/cpulist)");
  return topology;
}

int NumaTopology::num_cpus() const {
  int n = 0;
  for (const auto& cpus : node_cpus) n += static_cast<int>(cpus.size());
  return n;
}

ThreadPlacement place_threads(const NumaTopology& topology, int num_threads) {
  ThreadPlacement placement;
  const int nodes = topology.num_nodes();
  const int cpus = std::max(1, topology.num_cpus());
  num_threads = std::max(1, num_threads);
  // Threads per node in proportion to its CPUs (largest remainders), each node at least one while threads last.
  std::vector<int> count(static_cast<size_t>(nodes), 0);
  int given = 0;
  for (int n = 0; n < nodes; ++n) {
    count[static_cast<size_t>(n)] =
        static_cast<int>(static_cast<int64_t>(num_threads) * static_cast<int64_t>(topology.node_cpus[static_cast<size_t>(n)].size()) / cpus);
    given += count[static_cast<size_t>(n)];
  }
  for (int n = 0; given < num_threads; n = (n + 1) % nodes) {
    ++count[static_cast<size_t>(n)];
    ++given;
  }
  placement.first_thread.push_back(0);
  for (int n = 0; n < nodes; ++n) {
    const auto& node_cpus = topology.node_cpus[static_cast<size_t>(n)];
    for (int i = 0; i < count[static_cast<size_t>(n)]; ++i) {
      placement.node_of_thread.push_back(n);
      placement.cpu_of_thread.push_back(node_cpus[static_cast<size_t>(i) % node_cpus.size()]);
    }
    placement.first_thread.push_back(placement.num_threads());
  }
  return placement;
}

RowRange node_row_range(int64_t rows, const std::vector<int>& first_thread, int node, int64_t grain) {
  grain = std::max<int64_t>(1, grain);
  const int nodes = static_cast<int>(first_thread.size()) - 1;
  const int64_t threads = std::max(1, first_thread.back());
  const int64_t blocks = (rows + grain - 1) / grain;
  // Node k ends at blocks * (threads before node k + 1) / threads; the last node takes the rest.
  auto end_block = [&](int k) {
    return k + 1 == nodes ? blocks : blocks * first_thread[static_cast<size_t>(k) + 1] / threads;
  };
  const int64_t begin = node == 0 ? 0 : end_block(node - 1);
  return {std::min(rows, begin * grain), std::min(rows, end_block(node) * grain)};
}

std::vector<RowRange> node_row_ranges(int64_t rows, const ThreadPlacement& placement, int64_t grain) {
  std::vector<RowRange> ranges(static_cast<size_t>(placement.num_nodes()));
  for (int n = 0; n < placement.num_nodes(); ++n) ranges[static_cast<size_t>(n)] = node_row_range(rows, placement.first_thread, n, grain);
  return ranges;
}

bool pin_current_thread(int cpu) {
  if (cpu < 0 || cpu >= CPU_SETSIZE) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

}  // namespace dsflash
