#pragma once
// Which kernel serves a grid_sampler backward: one decision, taken by the
// aten overrides behind detgrid.enable() and by detgrid's own operators,
// and exposed to Python (detgrid.ops.backward_route) so that CPU tests can
// check every case, the CUDA ones included.

#include <c10/core/DeviceType.h>

#include <array>

namespace detgrid {

enum class BackwardRoute { Stock, Detgrid };

// `deterministic` and `warn_only` are the state of
// torch.use_deterministic_algorithms (detgrid's own operators pass
// deterministic = true: they are asked for by name).
//
// Stock's kernel serves every call outside deterministic mode. Inside it:
// - a call that requests grad_input runs detgrid's kernel: stock scatters
//   grad_input with atomicAdd;
// - a call for grad_grid alone (or for nothing) has one writer per element,
//   so it is deterministic either way. On CPU stock's kernel serves it. On
//   CUDA every released torch alerts in the launcher before it looks at
//   output_mask, so detgrid's grid gradient serves it, with stock's
//   arithmetic (GridGradient.cu).
// warn_only changes no route: where stock would only warn, the call is one
// detgrid serves deterministically anyway, with no warning to give.
inline BackwardRoute backward_route(
    c10::DeviceType device,
    bool deterministic,
    bool warn_only,
    std::array<bool, 2> output_mask) {
  (void)warn_only;
  if (!deterministic) {
    return BackwardRoute::Stock;
  }
  if (output_mask[0] || device == c10::DeviceType::CUDA) {
    return BackwardRoute::Detgrid;
  }
  return BackwardRoute::Stock;
}

} // namespace detgrid
