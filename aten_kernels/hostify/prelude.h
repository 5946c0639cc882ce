#pragma once
// The host build of the deterministic backward's CUDA source
// (aten/src/ATen/native/cuda/GridSamplerDeterministic.cu), made the way
// hipify makes the ROCm build: hostify.py turns each `kernel<<<grid, block,
// shared, stream>>>(args)` into `::hostify::launch(kernel, grid, block,
// shared, stream)(args)`, this prelude is included first, and include/
// shadows the few CUDA runtime headers the source includes (the stream, the
// caching allocator, CUB). The kernels and the existing coordinate helpers
// (GridSampler.cuh, UpSample.cuh, from the installed torch) compile as they
// are. What the prelude provides:
// - the CUDA builtins they name: thread indices, the atomics and bit casts
//   of Atomic.cuh (never called by the kernels), ::min and ::max with
//   fminf's NaN rule, ::isfinite;
// - the launch: every block and thread of the grid, one at a time per
//   block, blocks in parallel, in an order and with a block size that
//   hostify::Config may permute and vary, so that a result depending on
//   thread order or launch shape fails a test.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <cstring>

// Everything here is defined in namespace hostify, and named where CUDA's
// builtins are by using-declarations: a definition of the builtin's own name
// would be merged with CUDA's at link time where the extension's CUDA build
// sits in the same library.
namespace hostify {

// Atomic.cuh names these for its gpuAtomicAdd overloads.
inline int atomicCAS(int* address, int compare, int value) {
  const int old = *address;
  *address = old == compare ? value : old;
  return old;
}
inline unsigned atomicCAS(unsigned* address, unsigned compare, unsigned value) {
  const unsigned old = *address;
  *address = old == compare ? value : old;
  return old;
}
inline unsigned short atomicCAS(
    unsigned short* address,
    unsigned short compare,
    unsigned short value) {
  const unsigned short old = *address;
  *address = old == compare ? value : old;
  return old;
}
inline unsigned long long atomicCAS(
    unsigned long long* address,
    unsigned long long compare,
    unsigned long long value) {
  const unsigned long long old = *address;
  *address = old == compare ? value : old;
  return old;
}
template <typename T, typename U>
inline T atomicAdd(T* address, U value) {
  const T old = *address;
  *address = old + value;
  return old;
}
inline c10::Half atomicAdd(__half* address, c10::Half value) {
  return atomicAdd(reinterpret_cast<c10::Half*>(address), value);
}
inline c10::BFloat16 atomicAdd(__nv_bfloat16* address, c10::BFloat16 value) {
  return atomicAdd(reinterpret_cast<c10::BFloat16*>(address), value);
}

template <typename To, typename From>
To bit_cast(From from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}

inline float __int_as_float(int x) {
  return bit_cast<float>(x);
}
inline int __float_as_int(float x) {
  return bit_cast<int>(x);
}
inline double __longlong_as_double(long long x) {
  return bit_cast<double>(x);
}
inline long long __double_as_longlong(double x) {
  return bit_cast<long long>(x);
}
inline __nv_bfloat16 __int2bfloat16_rz(int x) {
  const auto bits = bit_cast<unsigned>(static_cast<float>(x));
  return bit_cast<__nv_bfloat16>(static_cast<unsigned short>(bits >> 16));
}

// CUDA's ::min and ::max of floating types are fminf and fmaxf: the operand
// that is not NaN (clip_coordinates turns a NaN coordinate into 0 by it).
inline float min(float a, float b) {
  return std::fmin(a, b);
}
inline float max(float a, float b) {
  return std::fmax(a, b);
}
inline double min(double a, double b) {
  return std::fmin(a, b);
}
inline double max(double a, double b) {
  return std::fmax(a, b);
}

// CUDA's __fadd_rn and __dadd_rn: an add that is never fused with a
// multiply before it. The host build contracts a * b + c where nvcc would
// (-ffp-contract=fast), so the addend passes through an empty asm first,
// which hides the product it came from.
template <typename T>
T opaque(T value) {
#if defined(__x86_64__) || defined(__i386__)
  asm("" : "+x"(value));
#else
  asm("" : "+m"(value));
#endif
  return value;
}
inline float __fadd_rn(float a, float b) {
  return a + opaque(b);
}
inline double __dadd_rn(double a, double b) {
  return a + opaque(b);
}

} // namespace hostify

using hostify::__dadd_rn;
using hostify::__double_as_longlong;
using hostify::__fadd_rn;
using hostify::__float_as_int;
using hostify::__int2bfloat16_rz;
using hostify::__int_as_float;
using hostify::__longlong_as_double;
using hostify::atomicAdd;
using hostify::atomicCAS;
using hostify::max;
using hostify::min;
using std::isfinite;

// Launch bounds shape the device code alone.
#define C10_LAUNCH_BOUNDS_1(max_threads_per_block)
#define C10_LAUNCH_BOUNDS_2(max_threads_per_block, min_blocks_per_sm)

#include "launch.h"
