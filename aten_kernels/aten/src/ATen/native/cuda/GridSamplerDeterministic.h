#pragma once
#include <array>
#include <cstdint>

namespace at {
class TensorBase;
}

namespace at::native {

// Knobs of the deterministic backward that do not change its result; tests
// turn them to prove that. Zero means the default, which ATen always uses.
struct GridSamplerDeterministicOptions {
  // Points per chunk of records; a multiple of the tile size (4096).
  int64_t chunk_points = 0;
  // Threads per block and a cap on blocks per launch (grid-stride loops).
  int64_t block_size = 0;
  int64_t max_blocks = 0;
  // Width of the sort keys and of the index math: 32 or 64, or 0 for 32
  // wherever the problem fits (32 is an error where it does not).
  int64_t key_bits = 0;
  int64_t index_bits = 0;
  // How the sort is keyed: 0 for one key per point wherever bilinear or
  // trilinear sampling reduces densely, 1 for one key per tap everywhere.
  int64_t keying = 0;
  // How the dense reduce's threads take (destination, channel) pairs: 0 for
  // channels fastest from 16 channels on, 1 for destinations fastest, 2 for
  // channels fastest.
  int64_t gather = 0;
};

// The arguments of one backward call, as the launchers below receive them;
// the executors of the deterministic pipeline take them bundled.
struct GridSamplerBackwardCall {
  const TensorBase& grad_input;
  const TensorBase& grad_grid;
  const TensorBase& grad_output;
  const TensorBase& input;
  const TensorBase& grid;
  int64_t interpolation_mode;
  int64_t padding_mode;
  bool align_corners;
  std::array<bool, 2> output_mask;
};

// Same contracts as launch_grid_sampler_{2d,3d}_backward_kernel
// (GridSampler.h), without floating-point atomics: the result is bitwise
// reproducible. Every element of grad_input is written (it need not be
// zeroed) and must be contiguous, as GridSampler.cpp allocates it. The grid
// gradient is computed only when output_mask[1] is set; otherwise a defined
// (contiguous) grad_grid is filled with zeros.
void launch_grid_sampler_2d_backward_deterministic_kernel(
    const TensorBase& grad_input,
    const TensorBase& grad_grid,
    const TensorBase& grad_output,
    const TensorBase& input,
    const TensorBase& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    std::array<bool, 2> output_mask,
    const GridSamplerDeterministicOptions& options = {});

void launch_grid_sampler_3d_backward_deterministic_kernel(
    const TensorBase& grad_input,
    const TensorBase& grad_grid,
    const TensorBase& grad_output,
    const TensorBase& input,
    const TensorBase& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    std::array<bool, 2> output_mask,
    const GridSamplerDeterministicOptions& options = {});

} // namespace at::native
