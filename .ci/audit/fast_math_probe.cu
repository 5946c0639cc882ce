// Negative control of .ci/sass_audit.sh: one point pass and one reduce of
// the real pipeline, built with --use_fast_math, must fail the audit (its
// flush-to-zero forms of detgrid's arithmetic). Small, so that the control
// costs seconds where the whole .cu file costs minutes.
#include <ATen/native/cuda/GridSamplerDeterministicPipeline.cuh>

namespace {
using namespace at::native::grid_sampler_deterministic;

using Args = BackwardArgs<float, int, 2>;
using Pass = PointPass<2, Args>;
using Reduce = ReduceDense<DenseFold<CellSegments<int, 2>, float, int>>;

__global__ void GridSamplerDeterministic_cu_point_pass(const Pass stage, int count) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) {
    stage(i);
  }
}

__global__ void GridSamplerDeterministic_cu_reduce(const Reduce stage, int rows, int cols) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (blockIdx.y < rows && c < cols) {
    stage(stage.row(blockIdx.y), c);
  }
}
} // namespace

void launch_probes(const Pass& pass, const Reduce& reduce) {
  GridSamplerDeterministic_cu_point_pass<<<1, 32>>>(pass, 32);
  GridSamplerDeterministic_cu_reduce<<<1, 32>>>(reduce, 1, 32);
}
