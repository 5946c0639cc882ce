#pragma once
// The host side of a CUDA launch and of the device memory the source asks
// for (see prelude.h). Config varies how a launch runs; Counters records
// what a call launched, sorted and allocated, exactly as the CUDA build does
// it, for detgrid.ops.work_counters.

#include "control.h"

#include <ATen/Parallel.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

namespace hostify {

struct ThreadPosition {
  dim3 block_idx;
  dim3 thread_idx;
  dim3 block_dim;
  dim3 grid_dim;
};
inline thread_local ThreadPosition position;

// 0 .. count - 1, permuted by the seed where it is nonzero.
inline std::vector<unsigned> visiting_order(unsigned count, uint64_t seed) {
  std::vector<unsigned> order(count);
  std::iota(order.begin(), order.end(), 0u);
  if (seed != 0) {
    std::shuffle(order.begin(), order.end(), std::mt19937_64(seed + count));
  }
  return order;
}

template <typename Body>
void run_grid(dim3 grid, dim3 block, const Body& body) {
  const Config& cfg = config();
  if (cfg.block_size > 0) {
    block = dim3(static_cast<unsigned>(cfg.block_size));
  }
  if (cfg.grid_size > 0) {
    grid = dim3(static_cast<unsigned>(cfg.grid_size));
  }
  counters().threads += int64_t{grid.x} * block.x;
  const std::vector<unsigned> blocks = visiting_order(grid.x, cfg.shuffle_seed);
  const std::vector<unsigned> threads =
      visiting_order(block.x, cfg.shuffle_seed * 31 + 7);
  at::parallel_for(0, grid.x, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      position.grid_dim = grid;
      position.block_dim = block;
      position.block_idx = dim3(blocks[b]);
      for (const unsigned t : threads) {
        position.thread_idx = dim3(t);
        body();
      }
    }
  });
}

template <typename... Params>
struct Launch {
  void (*kernel)(Params...);
  dim3 grid;
  dim3 block;

  template <typename... Args>
  void operator()(Args&&... args) const {
    ++counters().launches;
    if (!config().run) {
      counters().threads += int64_t{grid.x} * block.x;
      return;
    }
    const std::tuple<std::decay_t<Params>...> params(std::forward<Args>(args)...);
    run_grid(grid, block, [&] { std::apply(kernel, params); });
  }
};

template <typename... Params>
Launch<Params...> launch(
    void (*kernel)(Params...),
    dim3 grid,
    dim3 block,
    size_t /*shared_bytes*/ = 0,
    cudaStream_t /*stream*/ = nullptr) {
  return Launch<Params...>{kernel, grid, block};
}

inline cudaError_t memset_async(
    void* data,
    int value,
    size_t bytes,
    cudaStream_t /*stream*/ = nullptr) {
  ++counters().launches;
  if (config().run) {
    std::memset(data, value, bytes);
  }
  return cudaSuccess;
}

// Device memory from the caching allocator: host memory, filled with 0xff
// bytes (NaN in every floating type, -1 in every integer) so that a read of
// an element no kernel wrote shows in the result; its bytes are counted
// while they live.
struct WorkspaceAllocator {
  c10::DataPtr allocate(size_t bytes) const {
    Counters& count = counters();
    count.live_bytes += static_cast<int64_t>(bytes);
    count.workspace_bytes = std::max(count.workspace_bytes, count.live_bytes);
    auto* block = new Block{bytes, c10::DataPtr()};
    if (config().run) {
      block->memory = c10::GetCPUAllocator()->allocate(bytes);
      if (bytes > 0) {
        std::memset(block->memory.get(), 0xff, bytes);
      }
    }
    // A call that is only counted gets a pointer it never reads, but not a
    // null one: the core tests a scratch's pointer to know that it made one.
    alignas(std::max_align_t) static char nothing;
    void* data = config().run ? block->memory.get() : &nothing;
    return c10::DataPtr(
        data, block, &release, c10::Device(c10::DeviceType::CPU));
  }

 private:
  struct Block {
    size_t bytes;
    c10::DataPtr memory;
  };
  static void release(void* context) {
    auto* block = static_cast<Block*>(context);
    counters().live_bytes -= static_cast<int64_t>(block->bytes);
    delete block;
  }
};

inline WorkspaceAllocator* workspace_allocator() {
  static WorkspaceAllocator allocator;
  return &allocator;
}

} // namespace hostify

#define blockIdx (::hostify::position.block_idx)
#define threadIdx (::hostify::position.thread_idx)
#define blockDim (::hostify::position.block_dim)
#define gridDim (::hostify::position.grid_dim)
#define cudaMemsetAsync ::hostify::memset_async
