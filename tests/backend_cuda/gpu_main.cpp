// doctest main for GPU tests: without a CUDA device the binary exits with kSkipReturnCode (77),
// which ctest's SKIP_RETURN_CODE turns into "skipped", so a CPU-only machine never reports a pass.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "moeplan/backend/cuda/device.hpp"
#include "moeplan/backend/cuda/kernels.hpp"

int main(int argc, char** argv) {
  using namespace moeplan::backend::cuda;
#ifdef MOEPLAN_CUDA_EMULATION
  // The emulated machine shows MOEPLAN_EMU_DEVICES devices, and reads CUDA_VISIBLE_DEVICES as
  // CUDA does (for `run --points-at-once`'s workers): one the machine running the tests set for
  // its real GPUs (often "0") would hide the emulated ones the tests ask for.
  ::unsetenv("CUDA_VISIBLE_DEVICES");
#endif
  try {
    if (device_count() == 0) {
      std::printf("no CUDA device: GPU tests skipped\n");
      return kSkipReturnCode;
    }
  } catch (const std::exception& e) {  // a GPU CUDA cannot use (an old driver): a failure
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  // MOEPLAN_TEST_LAUNCH=pdl: every launch of the project's kernels programmatic (launch.cuh), to
  // run the same tests that way (ctest's *_pdl variants; gpu-check on a GPU).
  if (const char* launch = std::getenv("MOEPLAN_TEST_LAUNCH")) {
    const std::string v = launch;
    if (v != "pdl" && v != "plain") {
      std::fprintf(stderr, "MOEPLAN_TEST_LAUNCH=%s is not known (valid: pdl, plain)\n", launch);
      return 2;
    }
    kernels::set_programmatic_launch(v == "pdl");
    std::printf("launches: %s\n", launch);
  }
  const DeviceInfo d = device_info(0);
  std::printf("device: %s (%d SMs, %.0f GiB)\n", d.name.c_str(), d.multiprocessors, d.memory_gib);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
