// The Autograd kernel of detgrid's own operators (torch.ops.detgrid.*).
//
// They are a backward, and they have no backward of their own. Without a
// kernel at the Autograd key the dispatcher's fallback lets a call with
// inputs that require grad through with only a deprecation warning, and the
// outputs then carry a grad_fn that backpropagates nothing: wrong gradients,
// silently. This kernel refuses such a call instead, and is a plain
// pass-through for every other call.
//
// Why an error and not a double backward: the derivative of the backward
// needs the second derivatives of every interpolation weight and padding
// rule (bicubic and tricubic included), which is a kernel of its own with its
// own determinism proof. Code that needs gradients of gradients gets them
// from F.grid_sample with detgrid.enable(): autograd's double-backward
// formula of aten::grid_sampler_{2d,3d}_backward then wraps the routed
// kernel, so nothing is lost by refusing here.

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

namespace detgrid {
namespace {

bool any_argument_requires_grad(
    const c10::OperatorHandle& op,
    const torch::jit::Stack& stack) {
  const auto arguments = op.schema().arguments().size();
  for (const c10::IValue& argument : torch::jit::last(stack, arguments)) {
    if (argument.isTensor() && argument.toTensor().requires_grad()) {
      return true;
    }
  }
  return false;
}

void refuse_differentiation(
    const c10::OperatorHandle& op,
    c10::DispatchKeySet keys,
    torch::jit::Stack* stack) {
  TORCH_CHECK(
      !(c10::GradMode::is_enabled() && any_argument_requires_grad(op, *stack)),
      op.schema().name(),
      " is a backward and has no derivative of its own, but an input "
      "requires grad: call it under torch.no_grad() or on detached tensors. "
      "For gradients of gradients use F.grid_sample with detgrid.enable().");
  at::AutoDispatchBelowADInplaceOrView guard;
  op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
}

} // namespace

TORCH_LIBRARY_IMPL(detgrid, Autograd, m) {
  for (const char* name :
       {"grid_sampler_2d_backward",
        "grid_sampler_3d_backward",
        "_core_grad_input",
        "_grid_gradient"}) {
    m.impl(
        name,
        torch::CppFunction::makeFromBoxedFunction<&refuse_differentiation>());
  }
}

} // namespace detgrid
