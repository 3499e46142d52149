#pragma once
// Typed errors: the message names the offending value and what would be valid.
#include <stdexcept>
#include <string>

namespace moeplan {

// Bad input from a user (flag, file, manifest). The CLI prints what() on one line and exits 2.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace moeplan
