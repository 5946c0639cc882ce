#pragma once
// hostify's stand-in (see ../../../prelude.h): the current stream. Defined
// in namespace hostify and named in at::cuda by a using-declaration, so that
// no definition here is merged with libtorch's at link time.
#include <cuda_runtime.h>

namespace hostify {
inline cudaStream_t getCurrentCUDAStream() {
  return nullptr;
}
} // namespace hostify

namespace at::cuda {
using ::hostify::getCurrentCUDAStream;
} // namespace at::cuda
