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

bool contracts_multiply_adds() {
#ifdef __FMA__
  return true;
#else
  return false;
#endif
}

} // namespace hostify
