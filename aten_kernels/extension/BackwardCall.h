#pragma once
// A backward call as aten's operators receive it: the deterministic
// pipeline's call (grad_input's half, GridSamplerDeterministic.h) with
// grad_grid and output_mask beside it. Upstream, grad_grid is stock's
// kernel's; the extension makes it with GridGradient.cu, in stock's
// arithmetic.

#include <ATen/core/TensorBase.h>
#include <ATen/native/cuda/GridSamplerDeterministic.h>

#include <array>

namespace detgrid {

struct BackwardCall : at::native::GridSamplerBackwardCall {
  const at::TensorBase& grad_grid;
  std::array<bool, 2> output_mask;
};

} // namespace detgrid
