#include "control.h"

namespace hostify {

Config& config() {
  static Config value;
  return value;
}

Counters& counters() {
  static Counters value;
  return value;
}

// Probed, not read from the flags: this unit is compiled with the core's
// flags, and whether g++ fuses a * b + c depends on the optimizer too (it
// does at -O2 with -mfma -ffp-contract=fast, not at -O1). (1 + 2^-12)^2
// rounds to 1 + 2^-11 in float, so the sum below is 0 unless it is fused.
bool contracts_multiply_adds() {
  volatile float a = 1.0f + 0x1p-12f;
  volatile float c = -(1.0f + 0x1p-11f);
  const float x = a;
  const float z = c;
  return x * x + z != 0.0f;
}

} // namespace hostify
