#pragma once
// hostify's stand-in (see ../../../prelude.h): device memory is host memory.
#include "../../../launch.h"

namespace c10::cuda::CUDACachingAllocator {
inline hostify::WorkspaceAllocator* get() {
  return hostify::workspace_allocator();
}
} // namespace c10::cuda::CUDACachingAllocator
