#include "knobs.h"

#include <optional>
#include <string>
#include <utility>

namespace detgrid {
namespace {

namespace gsd = at::native::grid_sampler_deterministic;
using gsd::BackwardPlan;
using gsd::BackwardProblem;
using gsd::Keying;

// The prefix of every knob error, as the pipeline's own errors name the op.
std::string op_prefix(const detgrid::BackwardCall& call) {
  return call.input.dim() == 4 ? "grid_sampler_2d_backward (deterministic): "
                               : "grid_sampler_3d_backward (deterministic): ";
}

void check_knob_ranges(
    const BackwardOptions& knobs,
    const BackwardProblem& problem,
    const std::string& op) {
  // The knobs that are 0 or 1, with what each value asks for.
  struct Switch {
    const char* name;
    int64_t value;
    const char* choices;
  };
  for (const Switch& knob :
       {Switch{"keying", knobs.keying, "0 (automatic) or 1 (per tap)"},
        Switch{
            "serial_fold",
            knobs.serial_fold,
            "0 (hot destinations in parallel) or 1"},
        Switch{"reduce", knobs.reduce, "0 (automatic) or 1 (sparse)"},
        Switch{
            "channel_group",
            knobs.channel_group,
            "0 (groups of channels) or 1 (one channel)"},
        Switch{
            "separate_fills",
            knobs.separate_fills,
            "0 (in the point pass) or 1 (launches of their own)"}}) {
    TORCH_CHECK(
        knob.value == 0 || knob.value == 1,
        op,
        knob.name,
        " must be ",
        knob.choices,
        ", got ",
        knob.value);
  }
  TORCH_CHECK(
      knobs.accumulate >= kAccumulateOrdered &&
          knobs.accumulate <= kAccumulateExactAtomic,
      op,
      "accumulate must be 0 (ordered), 1 (exact) or 2 (exact, atomic), got ",
      knobs.accumulate);
  TORCH_CHECK(
      knobs.carry_elements >= 0,
      op,
      "carry_elements must be 0 (as planned) or positive, got ",
      knobs.carry_elements);
  TORCH_CHECK(
      knobs.gather >= 0 && knobs.gather <= 2,
      op,
      "gather must be 0 (automatic), 1 (destinations fastest) or 2 (channels "
      "fastest), got ",
      knobs.gather);
  for (const auto& [name, bits] :
       {std::pair{"key_bits", knobs.key_bits},
        std::pair{"index_bits", knobs.index_bits}}) {
    TORCH_CHECK(
        bits == 0 || bits == 32 || bits == 64,
        op,
        name,
        " must be 0 (automatic), 32 or 64, got ",
        bits);
  }
  // Dividing, not multiplying: 4 * 2^62 wraps to 0.
  TORCH_CHECK(
      knobs.chunk_points == 0 ||
          (knobs.chunk_points > 0 && knobs.chunk_points % gsd::kTilePoints == 0 &&
           knobs.chunk_points <=
               gsd::kMaxChunkRecords / problem.taps_per_point),
      op,
      "chunk_points must be a positive multiple of ",
      gsd::kTilePoints,
      " with chunk_points * taps < 2^31, got ",
      knobs.chunk_points);
}

// The width a `bits` knob asks for, where `fits` says whether 32 bits hold
// the quantity.
bool use_32_bits(int64_t bits, bool fits, const char* name, const std::string& op) {
  TORCH_CHECK(
      bits != 32 || fits, op, name, "=32, but this problem needs 64 bits");
  return bits == 32 || (bits == 0 && fits);
}

// The chunks of the sparse reduction, sized as plan_reduction sizes them
// where no dense table fits: a table with more entries than a chunk has
// records never does. The ATen planner has no switch that forbids the table
// (only this knob needs one), hence its carry step repeated here.
gsd::ChunkPlan sparse_chunks(
    const BackwardProblem& problem,
    bool key_32bit,
    bool index_32bit,
    int64_t chunk_points) {
  if (chunk_points != 0) {
    return gsd::with_carry({chunk_points, false}, problem);
  }
  const int64_t no_table = problem.num_points * problem.taps_per_point + 1;
  auto within = [&](int64_t workspace_bytes) {
    return gsd::with_carry(
        gsd::plan_chunks(
            problem.num_points,
            problem.taps_per_point,
            no_table,
            gsd::chunk_bytes_per_point(
                problem.taps_per_point,
                problem.taps_per_point,
                key_32bit ? 4 : 8,
                problem.opmath_bytes,
                index_32bit ? 4 : 8),
            0,
            workspace_bytes),
        problem);
  };
  const gsd::ChunkPlan chunks = within(gsd::kWorkspaceBytes);
  if (chunks.carry_elements == 0) {
    return chunks;
  }
  return within(
      gsd::kWorkspaceBytes - chunks.carry_elements * problem.opmath_bytes);
}

// The plan for records keyed by `keying` under the knobs; nullopt where
// per-cell keys cannot run as asked (64-bit keys while key_bits forces 32,
// or chunks too small for a dense table), so that per-tap keys run instead.
std::optional<BackwardPlan> plan_keyed_with_knobs(
    const BackwardProblem& problem,
    Keying keying,
    const BackwardOptions& knobs,
    bool index_32bit,
    const std::string& op) {
  const bool keys_fit = gsd::keys_fit_32bit(problem.table_entries(keying));
  if (keying == Keying::PerCell && knobs.key_bits == 32 && !keys_fit) {
    return std::nullopt;
  }
  BackwardPlan plan;
  plan.index_32bit = index_32bit;
  plan.keying = keying;
  plan.key_32bit = use_32_bits(knobs.key_bits, keys_fit, "key_bits", op);
  const bool channels_fastest = knobs.gather == 0
      ? gsd::prefers_channels_fastest(problem.channels)
      : knobs.gather == 2;
  if (knobs.reduce == 1) {
    plan.chunks = sparse_chunks(
        problem, plan.key_32bit, index_32bit, knobs.chunk_points);
  } else if (knobs.chunk_points == 0) {
    plan.chunks = gsd::plan_reduction(
        plan.key_32bit, index_32bit, channels_fastest, keying, problem);
  } else {
    // A chunk size of the caller's is not held to the workspace budget.
    const bool dense = gsd::dense_table_fits(
        problem.table_entries(keying),
        problem.num_points,
        knobs.chunk_points,
        problem.taps_per_point);
    plan.chunks = gsd::with_carry(
        gsd::with_thread_order(
            {knobs.chunk_points, dense}, channels_fastest, problem),
        problem);
  }
  if (keying == Keying::PerCell && !plan.chunks.dense) {
    return std::nullopt;
  }
  // As plan_keyed, unless serial_fold asks every destination to fold alone.
  plan.hot_fold = knobs.serial_fold == 0 && index_32bit && plan.chunks.dense;
  plan.channel_groups = knobs.channel_group == 0;
  plan.fused_fills = knobs.separate_fills == 0;
  if (knobs.carry_elements > 0 && plan.chunks.carry_elements > 0) {
    plan.chunks.carry_elements =
        std::min(plan.chunks.carry_elements, knobs.carry_elements);
  }
  return plan;
}

} // namespace

BackwardPlan plan_with_knobs(
    const detgrid::BackwardCall& call,
    const BackwardOptions& requested) {
  const BackwardProblem problem = gsd::describe_backward(call);
  const std::string op = op_prefix(call);
  check_knob_ranges(requested, problem, op);
  BackwardOptions knobs = requested;
  if (knobs.accumulate != kAccumulateOrdered) {
    // The exact accumulation is built for 32-bit keys only, which halves
    // what the prototype adds to every build.
    TORCH_CHECK(
        knobs.key_bits != 64,
        op,
        "accumulate=\"exact\" sorts 32-bit keys: key_bits must be 0 or 32, got 64");
    knobs.key_bits = 32;
  }
  // 3-D bicubic sampling is built with 64-bit index math only.
  TORCH_CHECK(
      knobs.index_bits != 32 ||
          gsd::has_32bit_index_math(
              static_cast<int>(problem.taps_per_axis),
              static_cast<int>(problem.dims)),
      op,
      "index_bits=32, but 3-D bicubic sampling runs with 64-bit index math only");
  const bool index_32bit = use_32_bits(
      knobs.index_bits, gsd::index_32bit_for(problem), "index_bits", op);
  // Callers plan only calls that request grad_input (grad_grid alone runs
  // stock's kernel).
  TORCH_INTERNAL_ASSERT(call.output_mask[0]);
  TORCH_CHECK(
      knobs.accumulate == kAccumulateOrdered ||
          gsd::keys_fit_32bit(problem.table_entries(Keying::PerTap)),
      op,
      "accumulate=\"exact\" sorts 32-bit keys, but this problem has ",
      problem.table_entries(Keying::PerTap),
      " destinations (at most 2^31 - 2)");
  // As plan_backward: per-cell keys wherever they reduce densely, but for
  // the atomic exact sums, which scatter from per-tap keys.
  if (knobs.keying == 0 && problem.taps_per_axis == 2 &&
      knobs.accumulate != kAccumulateExactAtomic) {
    if (auto plan =
            plan_keyed_with_knobs(problem, Keying::PerCell, knobs, index_32bit, op)) {
      return *plan;
    }
  }
  return *plan_keyed_with_knobs(
      problem, Keying::PerTap, knobs, index_32bit, op);
}

} // namespace detgrid
