#pragma once
// hostify's stand-in (see ../../../prelude.h): device memory is host memory.
// c10::cuda::CUDACachingAllocator names namespace hostify::caching_allocator,
// so that no definition here is merged with c10's at link time.
#include "../../../launch.h"

namespace hostify::caching_allocator {
inline WorkspaceAllocator* get() {
  return workspace_allocator();
}
} // namespace hostify::caching_allocator

namespace c10::cuda {
namespace CUDACachingAllocator = ::hostify::caching_allocator;
} // namespace c10::cuda
