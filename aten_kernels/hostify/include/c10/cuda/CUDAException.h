#pragma once
// hostify's stand-in (see ../../../prelude.h): the launch and call checks.
#include <c10/util/Exception.h>

#define C10_CUDA_CHECK(EXPR) \
  TORCH_CHECK((EXPR) == cudaSuccess, "hostify: ", #EXPR, " failed")
#define C10_CUDA_KERNEL_LAUNCH_CHECK() ((void)0)
