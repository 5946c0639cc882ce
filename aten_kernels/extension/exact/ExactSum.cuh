#pragma once
// Exact accumulation of grad_input terms: the numerical contract of
// accumulate="exact" (an extension-only prototype; upstream's files know
// nothing of it). benchmarks/NOTES.md restates it with the costs.
//
// A term is what the ordered fold adds: t = round(weight * grad_output), an
// opmath value T (float for float, Half and BFloat16; double for double).
// Its sum over a grad_input element is formed exactly, as an integer, so the
// order of the terms cannot change a bit, and is rounded once.
//
// 1. Scale. A pre-pass finds G = max over finite grad_output values of the
//    smallest g_top with |g| < 2^g_top (a max of integers: any order gives
//    it). Every weight is at most 2^kDims in magnitude (bilinear weights are
//    products of kDims axis weights in [0, 2]: Half and BFloat16 round an
//    integer tap position up by one at most, past their run of consecutive
//    integers; nearest and bicubic weights are at most 1), so a finite term
//    satisfies |t| <= 2^(G + kDims) < 2^top with top = G + kDims + 1.
// 2. Fixed point. A term becomes the integer round(t / 2^unit) with
//    unit = top - 32 * kWords (round to nearest, ties to even), below
//    2^(32 * kWords) in magnitude; kWords is 3 for float opmath and 5 for
//    double. The floor: a term whose lowest set bit lies at or above 2^unit
//    (float: every term within 2^-73 of 2^top; double: within 2^-107) is
//    exact; a smaller one is rounded to a multiple of 2^unit, by a rule that
//    depends on the term alone, so the sum is still order-free.
// 3. Slices. That integer is cut into kWords signed 32-bit words (its sign
//    on every word), and word i is added to slice i, an int64. Integer
//    addition is associative, so every order of the terms, every chunking
//    and every thread interleaving gives the same slices. A word is below
//    2^32, so at most kMaxTermsPerElement = 2^31 - 1 terms per element keep
//    every slice below 2^63: no slice can overflow. The caller checks the
//    bound from the shapes.
// 4. Rounding. The slices are summed into one wide two's complement integer
//    S (sum of slice_i * 2^(32 i)), and S * 2^unit is rounded once, to
//    nearest with ties to even, straight to the output dtype (Half and
//    BFloat16 too, with no rounding through float on the way); a sum beyond
//    the dtype's range becomes +-Inf, as IEEE rounding has it; zero is +0.
// 5. NaN and Inf. A term that is not finite sets a flag instead: +Inf,
//    -Inf or NaN. The result is NaN after a NaN or after both infinities,
//    else the one infinity, as a float sum of the same terms would be in any
//    order. A finite term at or above 2^top (the weight bound broken) sets
//    its own flag and makes the result NaN: loud, never silently wrong.
//
// Everything here is C10_HOST_DEVICE: the host executor and CUDA run it.
// Only the three atomics differ: std::atomic_ref on the host, CUDA's
// integer atomics on the device.

#include <c10/macros/Macros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#if !defined(__CUDA_ARCH__)
#include <atomic>
#endif

namespace detgrid::exact {

constexpr int kWordBits = 32;
constexpr int64_t kMaxTermsPerElement = (int64_t{1} << 31) - 1;

// Flags of the terms that bypass the integer sum.
constexpr uint32_t kPositiveInfinity = 1;
constexpr uint32_t kNegativeInfinity = 2;
constexpr uint32_t kNotANumber = 4;
constexpr uint32_t kAboveBound = 8;

// The pre-pass stores g_top - kNoBound (at least 1), so that a zero fill
// means "no finite non-zero grad_output value".
constexpr int32_t kNoBound = -4096;

template <typename T>
struct Format;

template <>
struct Format<float> {
  using bits_t = uint32_t;
  static constexpr int kWords = 3;
  static constexpr int kMantissaBits = 24;
  static constexpr int kExponentBias = 127;
  // A 24-bit significand (25 after rounding up) spans two words at most.
  static constexpr int kWordsPerTerm = 2;
};

template <>
struct Format<double> {
  using bits_t = uint64_t;
  static constexpr int kWords = 5;
  static constexpr int kMantissaBits = 53;
  static constexpr int kExponentBias = 1023;
  static constexpr int kWordsPerTerm = 3;
};

// The output dtypes' precision (bits of significand, hidden bit included)
// and range (exponents of the smallest and largest normal binade).
template <typename scalar_t>
struct Target;
template <>
struct Target<float> {
  static constexpr int kPrecision = 24, kMinExponent = -126, kMaxExponent = 127;
};
template <>
struct Target<double> {
  static constexpr int kPrecision = 53, kMinExponent = -1022,
                       kMaxExponent = 1023;
};
template <>
struct Target<c10::Half> {
  static constexpr int kPrecision = 11, kMinExponent = -14, kMaxExponent = 15;
};
template <>
struct Target<c10::BFloat16> {
  static constexpr int kPrecision = 8, kMinExponent = -126, kMaxExponent = 127;
};

C10_HOST_DEVICE inline int bit_length(uint64_t x) {
#if defined(__CUDA_ARCH__)
  return 64 - __clzll(static_cast<long long>(x));
#else
  return x == 0 ? 0 : 64 - __builtin_clzll(x);
#endif
}

template <typename T>
C10_HOST_DEVICE inline typename Format<T>::bits_t bits_of(T x) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>) {
    return __float_as_uint(x);
  } else {
    return static_cast<uint64_t>(__double_as_longlong(x));
  }
#else
  typename Format<T>::bits_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
#endif
}

// A finite x as mantissa * 2^exponent exactly, mantissa < 2^kMantissaBits.
struct Decomposed {
  uint64_t mantissa;
  int exponent;
  bool negative;
};

template <typename T>
C10_HOST_DEVICE inline Decomposed decompose(T x) {
  using F = Format<T>;
  constexpr int kFraction = F::kMantissaBits - 1;
  constexpr int kTotal = 8 * sizeof(T);
  const uint64_t bits = bits_of(x);
  const uint64_t fraction = bits & ((uint64_t{1} << kFraction) - 1);
  const int biased = static_cast<int>((bits >> kFraction) &
                                      ((uint64_t{1} << (kTotal - 1 - kFraction)) - 1));
  const bool negative = (bits >> (kTotal - 1)) != 0;
  if (biased == 0) { // zero or subnormal
    return {fraction, 1 - F::kExponentBias - kFraction, negative};
  }
  return {
      fraction | (uint64_t{1} << kFraction),
      biased - F::kExponentBias - kFraction,
      negative};
}

// The smallest e with |x| < 2^e, for a finite non-zero x.
template <typename T>
C10_HOST_DEVICE inline int magnitude_bound(T x) {
  const Decomposed d = decompose(x);
  return d.exponent + bit_length(d.mantissa);
}

// m / 2^shift rounded to nearest, ties to even, for m < 2^63.
C10_HOST_DEVICE inline uint64_t shift_right_nearest_even(uint64_t m, int shift) {
  if (shift >= 64) {
    return 0; // m / 2^64 < 1/2
  }
  const uint64_t kept = m >> shift;
  const uint64_t dropped = m & ((uint64_t{1} << shift) - 1);
  const uint64_t half = uint64_t{1} << (shift - 1);
  return kept + (dropped > half || (dropped == half && (kept & 1)) ? 1 : 0);
}

// Where a call's fixed point lies: finite terms are below 2^top, and the
// integers count units of 2^unit.
struct Scale {
  int32_t top;
  int32_t unit;
};

// The scale of a call of kDims spatial dimensions from the pre-pass's value.
template <typename T>
C10_HOST_DEVICE inline Scale scale_from(int32_t stored_bound, int dims) {
  const int32_t g_top = stored_bound + kNoBound;
  const int32_t top = g_top + dims + 1;
  return {top, top - kWordBits * Format<T>::kWords};
}

// The words term t adds to the slices (words[i] to slice i), or the flag it
// sets instead (then every word is zero).
template <typename T>
C10_HOST_DEVICE inline uint32_t term_words(
    T t,
    const Scale& scale,
    int64_t (&words)[Format<T>::kWords]) {
  constexpr int kWords = Format<T>::kWords;
#pragma unroll
  for (int i = 0; i < kWords; ++i) {
    words[i] = 0;
  }
  if (t != t) {
    return kNotANumber;
  }
  if (t == std::numeric_limits<T>::infinity()) {
    return kPositiveInfinity;
  }
  if (t == -std::numeric_limits<T>::infinity()) {
    return kNegativeInfinity;
  }
  if (t == static_cast<T>(0)) {
    return 0;
  }
  const Decomposed d = decompose(t);
  if (d.exponent + bit_length(d.mantissa) > scale.top) {
    return kAboveBound;
  }
  // |t| / 2^unit = mantissa * 2^shift.
  int shift = d.exponent - scale.unit;
  uint64_t mantissa = d.mantissa;
  if (shift < 0) {
    mantissa = shift_right_nearest_even(mantissa, -shift);
    shift = 0;
  }
#pragma unroll
  for (int i = 0; i < kWords; ++i) {
    // Bits [32 i, 32 i + 32) of mantissa * 2^shift.
    const int right = kWordBits * i - shift;
    uint64_t word = 0;
    if (right >= 0 && right < 64) {
      word = mantissa >> right;
    } else if (right < 0 && right > -kWordBits) {
      word = mantissa << -right;
    }
    word &= 0xffffffffu;
    const int64_t value = static_cast<int64_t>(word);
    words[i] = d.negative ? -value : value;
  }
  return 0;
}

// The exact sum of some terms, in registers (a thread's share of one
// element's terms).
template <typename T>
struct Accumulator {
  static constexpr int kWords = Format<T>::kWords;
  int64_t slice[kWords] = {};
  uint32_t flags = 0;

  C10_HOST_DEVICE void add(T t, const Scale& scale) {
    int64_t words[kWords];
    flags |= term_words(t, scale, words);
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      slice[i] += words[i];
    }
  }
};

// The three atomics, on the host and on the device; integer, hence
// order-free.
C10_HOST_DEVICE inline void atomic_add(int64_t* target, int64_t value) {
#if defined(__CUDA_ARCH__)
  atomicAdd(
      reinterpret_cast<unsigned long long*>(target),
      static_cast<unsigned long long>(value));
#else
  std::atomic_ref<int64_t>(*target).fetch_add(value, std::memory_order_relaxed);
#endif
}

C10_HOST_DEVICE inline void atomic_or(uint32_t* target, uint32_t value) {
#if defined(__CUDA_ARCH__)
  atomicOr(target, value);
#else
  std::atomic_ref<uint32_t>(*target).fetch_or(value, std::memory_order_relaxed);
#endif
}

C10_HOST_DEVICE inline void atomic_max(int32_t* target, int32_t value) {
#if defined(__CUDA_ARCH__)
  atomicMax(target, value);
#else
  std::atomic_ref<int32_t> ref(*target);
  int32_t seen = ref.load(std::memory_order_relaxed);
  while (seen < value &&
         !ref.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
#endif
}

// The slices of a block of grad_input elements, slice-major so that
// neighbouring elements' slices lie side by side.
template <typename T, typename index_t>
struct Slices {
  int64_t* words; // words[i * elements + e]: slice i of element e
  uint32_t* flags;
  index_t elements;

  // Adds a thread's exact partial sum; the caller is the element's only
  // writer during this launch.
  C10_HOST_DEVICE void add(index_t e, const Accumulator<T>& partial) const {
#pragma unroll
    for (int i = 0; i < Format<T>::kWords; ++i) {
      words[i * elements + e] += partial.slice[i];
    }
    flags[e] |= partial.flags;
  }

  // Adds one term from any thread: an atomic per non-zero word.
  C10_HOST_DEVICE void add_atomic(index_t e, T t, const Scale& scale) const {
    int64_t term[Format<T>::kWords];
    const uint32_t flag = term_words(t, scale, term);
    if (flag != 0) {
      atomic_or(flags + e, flag);
      return;
    }
#pragma unroll
    for (int i = 0; i < Format<T>::kWords; ++i) {
      if (term[i] != 0) {
        atomic_add(words + i * elements + e, term[i]);
      }
    }
  }
};

// A two's complement integer of kLimbs 64-bit limbs, least significant
// first: the sum of an element's slices.
template <int kLimbs>
struct Wide {
  uint64_t limb[kLimbs] = {};

  // Adds value * 2^(32 * word).
  C10_HOST_DEVICE void add_word(int64_t value, int word) {
    const int first = word / 2;
    const bool odd = (word & 1) != 0;
    const uint64_t extension = value < 0 ? ~uint64_t{0} : 0;
    uint64_t carry = 0;
#pragma unroll
    for (int j = 0; j < kLimbs; ++j) {
      uint64_t part;
      if (j < first) {
        continue;
      } else if (j == first) {
        part = odd ? static_cast<uint64_t>(value) << 32
                   : static_cast<uint64_t>(value);
      } else if (j == first + 1 && odd) {
        part = static_cast<uint64_t>(value >> 32);
      } else {
        part = extension;
      }
      const uint64_t sum = limb[j] + part;
      const uint64_t carried = sum + carry;
      carry = (sum < part ? 1 : 0) + (carried < sum ? 1 : 0);
      limb[j] = carried;
    }
  }

  C10_HOST_DEVICE bool negative() const {
    return (limb[kLimbs - 1] >> 63) != 0;
  }

  C10_HOST_DEVICE void negate() {
    uint64_t carry = 1;
#pragma unroll
    for (int j = 0; j < kLimbs; ++j) {
      const uint64_t inverted = ~limb[j];
      limb[j] = inverted + carry;
      carry = limb[j] < inverted ? 1 : 0;
    }
  }

  C10_HOST_DEVICE int bit_length() const {
    int length = 0;
#pragma unroll
    for (int j = 0; j < kLimbs; ++j) {
      if (limb[j] != 0) {
        length = 64 * j + exact::bit_length(limb[j]);
      }
    }
    return length;
  }

  // Bits [from, from + 64) (from >= 0). Each limb is shifted into place by
  // a step of constant index, as term_words cuts words: selecting limb
  // [from / 64] would be an indexed load, which puts the limbs in local
  // memory.
  C10_HOST_DEVICE uint64_t bits_from(int from) const {
    uint64_t bits = 0;
#pragma unroll
    for (int k = 0; k < kLimbs; ++k) {
      const int left = 64 * k - from; // where limb k's bit 0 lands
      if (left >= 0 && left < 64) {
        bits |= limb[k] << left;
      } else if (left < 0 && left > -64) {
        bits |= limb[k] >> -left;
      }
    }
    return bits;
  }

  // Whether any bit below `below` is set.
  C10_HOST_DEVICE bool any_below(int below) const {
    bool any = false;
#pragma unroll
    for (int k = 0; k < kLimbs; ++k) {
      const int low_bit = 64 * k;
      if (below >= low_bit + 64) {
        any = any || limb[k] != 0;
      } else if (below > low_bit) {
        any = any ||
            (limb[k] & ((uint64_t{1} << (below - low_bit)) - 1)) != 0;
      }
    }
    return any;
  }
};

template <typename scalar_t>
C10_HOST_DEVICE inline scalar_t not_a_number() {
  return static_cast<scalar_t>(std::numeric_limits<float>::quiet_NaN());
}

template <typename scalar_t>
C10_HOST_DEVICE inline scalar_t infinity(bool negative) {
  const float inf = std::numeric_limits<float>::infinity();
  return static_cast<scalar_t>(negative ? -inf : inf);
}

// magnitude * 2^exponent in scalar_t, for a magnitude below 2^54 already
// rounded to scalar_t's precision at that exponent: exact, or +-Inf beyond
// scalar_t's largest binade.
template <typename scalar_t>
C10_HOST_DEVICE inline scalar_t make_value(
    uint64_t magnitude,
    int exponent,
    bool negative) {
  if (bit_length(magnitude) - 1 + exponent > Target<scalar_t>::kMaxExponent) {
    return infinity<scalar_t>(negative);
  }
  const double value = ::ldexp(static_cast<double>(magnitude), exponent);
  if constexpr (std::is_same_v<scalar_t, double>) {
    return negative ? -value : value;
  } else {
    // Exact in float, then exact in Half or BFloat16.
    const float narrowed = static_cast<float>(value);
    return static_cast<scalar_t>(negative ? -narrowed : narrowed);
  }
}

// The element's value: its slices' sum times 2^unit, rounded once to
// scalar_t, or what its flags say.
template <typename scalar_t, typename T>
C10_HOST_DEVICE inline scalar_t round_sum(
    const int64_t (&slice)[Format<T>::kWords],
    uint32_t flags,
    const Scale& scale) {
  constexpr int kWords = Format<T>::kWords;
  using Out = Target<scalar_t>;
  if ((flags & (kNotANumber | kAboveBound)) != 0 ||
      (flags & (kPositiveInfinity | kNegativeInfinity)) ==
          (kPositiveInfinity | kNegativeInfinity)) {
    return not_a_number<scalar_t>();
  }
  if (flags != 0) {
    return infinity<scalar_t>(flags == kNegativeInfinity);
  }
  // Slices are below 2^63 each: the sum needs 32 (kWords - 1) + 64 bits
  // and a sign.
  constexpr int kLimbs = (kWordBits * (kWords - 1) + 64) / 64 + 1;
  Wide<kLimbs> sum;
#pragma unroll
  for (int i = 0; i < kWords; ++i) {
    sum.add_word(slice[i], i);
  }
  const bool negative = sum.negative();
  if (negative) {
    sum.negate();
  }
  const int length = sum.bit_length();
  if (length == 0) {
    return static_cast<scalar_t>(0.0f);
  }
  // The value's leading binade, and the weight of its last kept bit.
  const int leading = length - 1 + scale.unit;
  const int last = (leading > Out::kMinExponent ? leading : Out::kMinExponent) -
      (Out::kPrecision - 1);
  const int dropped = last - scale.unit;
  if (dropped <= 0) {
    return make_value<scalar_t>(sum.bits_from(0), scale.unit, negative);
  }
  uint64_t kept = sum.bits_from(dropped);
  const bool round_bit = (sum.bits_from(dropped - 1) & 1) != 0;
  const bool sticky = sum.any_below(dropped - 1);
  if (round_bit && (sticky || (kept & 1) != 0)) {
    ++kept;
  }
  return make_value<scalar_t>(kept, last, negative);
}

} // namespace detgrid::exact
