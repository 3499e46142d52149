// doctest main for GPU tests: without a CUDA device the binary exits with kSkipReturnCode (77),
// which ctest's SKIP_RETURN_CODE turns into "skipped", so a CPU-only machine never reports a pass.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <exception>

#include "moeplan/backend/cuda/device.hpp"

int main(int argc, char** argv) {
  using namespace moeplan::backend::cuda;
  try {
    if (device_count() == 0) {
      std::printf("no CUDA device: GPU tests skipped\n");
      return kSkipReturnCode;
    }
  } catch (const std::exception& e) {  // a GPU CUDA cannot use (an old driver): a failure
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  const DeviceInfo d = device_info(0);
  std::printf("device: %s (%d SMs, %.0f GiB)\n", d.name.c_str(), d.multiprocessors, d.memory_gib);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
