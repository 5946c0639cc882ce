#pragma once
// hostify's stand-in (see ../../../prelude.h) for the at::cuda::cub calls
// the source makes, with CUB's results: a stable radix sort over the key
// bits [begin_bit, end_bit) of CUB's bit pattern (a signed key's sign bit
// flipped), and the first value of each run of equal keys (the runs, the
// records of those with a destination and the longest run counted, see
// control.h). at::cuda::cub
// names namespace hostify::cub, so that no definition here is merged with
// libtorch's at link time.
#include "../../../launch.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <type_traits>
#include <vector>

namespace hostify::cub {

// The bits a radix sort looks at for keys up to max_key, as ATen's cub.h.
inline int get_num_bits(uint64_t max_key) {
  int bits = 1;
  while (bits < 64 && (max_key >> bits) != 0) {
    ++bits;
  }
  return bits;
}

template <typename key_t, typename value_t>
void radix_sort_pairs(
    const key_t* keys_in,
    key_t* keys_out,
    const value_t* values_in,
    value_t* values_out,
    int64_t n,
    bool descending = false,
    int64_t begin_bit = 0,
    int64_t end_bit = sizeof(key_t) * 8) {
  auto& count = counters();
  ++count.launches;
  ++count.sorts;
  count.items_sorted += n;
  count.sort_end_bit = end_bit;
  count.key_bytes = sizeof(key_t);
  if (!config().run || n == 0) {
    return;
  }
  using bits_t = std::make_unsigned_t<key_t>;
  constexpr int kKeyBits = sizeof(key_t) * 8;
  const bits_t window = end_bit - begin_bit >= kKeyBits
      ? ~bits_t{0}
      : (bits_t{1} << (end_bit - begin_bit)) - 1;
  auto digits = [&](key_t key) {
    bits_t bits = bit_cast<bits_t>(key);
    if constexpr (std::is_signed_v<key_t>) {
      bits ^= bits_t{1} << (kKeyBits - 1);
    }
    return static_cast<bits_t>((bits >> begin_bit) & window);
  };
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return descending ? digits(keys_in[a]) > digits(keys_in[b])
                      : digits(keys_in[a]) < digits(keys_in[b]);
  });
  for (int64_t i = 0; i < n; ++i) {
    keys_out[i] = keys_in[order[i]];
    values_out[i] = values_in[order[i]];
  }
}

template <
    typename KeysInputIteratorT,
    typename ValuesInputIteratorT,
    typename ValuesOutputIteratorT,
    typename NumSelectedIteratorT>
void unique_by_key(
    KeysInputIteratorT keys_in,
    ValuesInputIteratorT values_in,
    ValuesOutputIteratorT values_out,
    NumSelectedIteratorT num_selected,
    int64_t num_input_items) {
  using key_t = std::remove_cv_t<std::remove_reference_t<decltype(keys_in[0])>>;
  // CUB's unique keys, which ATen's wrapper allocates and drops.
  c10::DataPtr keys_out =
      workspace_allocator()->allocate(num_input_items * sizeof(key_t));
  ++counters().launches;
  if (!config().run) {
    return;
  }
  auto& count = counters();
  int64_t selected = 0;
  int64_t run_begin = 0;
  for (int64_t i = 0; i <= num_input_items; ++i) {
    if (i < num_input_items && i > 0 && keys_in[i] == keys_in[i - 1]) {
      continue;
    }
    // A run [run_begin, i) ends here.
    if (i > 0 && static_cast<int64_t>(keys_in[i - 1]) != config().nowhere_key) {
      count.longest_run = std::max<int64_t>(count.longest_run, i - run_begin);
      ++count.landed_runs;
      count.landed_records += i - run_begin;
    }
    if (i < num_input_items) {
      values_out[selected++] = values_in[i];
      run_begin = i;
    }
  }
  *num_selected = selected;
  count.runs += selected;
}

} // namespace hostify::cub

namespace at::cuda {
namespace cub = ::hostify::cub;
} // namespace at::cuda
