#pragma once
// bf16 for the CPU emulation of CUDA (see moeplan_cuda_emu.hpp).
#include "moeplan_cuda_emu.hpp"
