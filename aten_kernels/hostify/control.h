#pragma once
// What the extension sets and reads of the host build (see prelude.h): how
// launches run, and what a call launched, sorted and allocated, counted as
// the CUDA build does it (a CUB call is one launch).

#include <cstdint>

namespace hostify {

struct Config {
  // Threads per block and blocks per launch in place of the launch's own
  // (0 keeps them): every kernel loops over its work with a grid stride,
  // so any shape covers it.
  int64_t block_size = 0;
  int64_t grid_size = 0;
  // Nonzero: blocks, and threads within a block, run in an order permuted
  // by this seed.
  uint64_t shuffle_seed = 0;
  // false: launches, sorts and fills are counted, not run (the host code
  // never reads device memory, so a call runs through on shapes alone).
  bool run = true;
  // The key of the records that land nowhere (the core's out-of-bounds
  // taps), which the run lengths below leave out; -1 for none.
  int64_t nowhere_key = -1;
};

struct Counters {
  int64_t launches = 0; // kernels, CUB calls and fills
  int64_t sorts = 0; // radix sorts: the core sorts once per chunk
  int64_t items_sorted = 0;
  int64_t sort_end_bit = 0; // of the last sort
  int64_t key_bytes = 0;
  int64_t workspace_bytes = 0; // peak of the live allocations
  int64_t live_bytes = 0;
  int64_t threads = 0; // threads launched, over every kernel
  // The longest run of equal keys unique_by_key found, Config::nowhere_key's
  // left out: the most records of one grad_input position in a chunk.
  // Counted only where the call runs.
  int64_t longest_run = 0;
  // Runs of equal keys unique_by_key found, summed over its calls (a chunk
  // each): `runs` counts every run, Config::nowhere_key's included (the
  // run sums' num_runs); `landed_runs` and `landed_records` only the runs
  // whose key is not Config::nowhere_key, and the records in them: the
  // runs that have a grad_input position to write, and the records whose
  // terms are summed. Counted only where the call runs.
  int64_t runs = 0;
  int64_t landed_runs = 0;
  int64_t landed_records = 0;
};

// The one Config and Counters of the process (control.cpp).
Config& config();
Counters& counters();

// Whether the host build contracts a * b + c into fused multiply-adds, as
// nvcc does (setup.py builds it so where the CPU has them).
bool contracts_multiply_adds();

} // namespace hostify
