// accumulate="exact" on the host executors: the stages CUDA runs
// (ExactBackward.cuh), with at::parallel_for's threads taking the atomic
// variant's std::atomic_ref additions in whatever order they come.

#include "../GridSamplerDeterministicCPU.h"
#include "../HostExecutors.h"
#include "ExactBackward.cuh"

namespace detgrid {

void grid_sampler_backward_exact_executor(
    const detgrid::BackwardCall& call,
    const at::native::grid_sampler_deterministic::BackwardPlan& plan,
    bool atomic,
    int64_t grain_size) {
  check_grain_size(grain_size);
  check_rank(call.input);
  exact::run_exact_backward(
      HostExecutor{grain_size > 0 ? grain_size : kDefaultGrainSize},
      call,
      plan,
      atomic);
}

WorkCounters count_exact_backward_work(
    const detgrid::BackwardCall& call,
    const at::native::grid_sampler_deterministic::BackwardPlan& plan,
    bool atomic) {
  check_rank(call.input);
  WorkCounters counters;
  exact::run_exact_backward(CountingExecutor{&counters}, call, plan, atomic);
  return counters;
}

} // namespace detgrid
