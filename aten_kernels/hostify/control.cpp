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

} // namespace hostify
