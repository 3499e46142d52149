#pragma once
// NCCL for the CPU emulation of CUDA (see moeplan_cuda_emu.hpp): communicators of one or more
// ranks, one process each on one machine, meeting in shared memory (emu_libs.cpp); all-reduce
// (sum, average) of float, double and int64, synchronous, reduced in rank order; reduce-scatter
// (the same reduction, each rank keeping its chunk), all-gather and broadcast.
#include <cstddef>

#include "cuda_runtime.h"

enum ncclResult_t {
  ncclSuccess = 0,
  ncclSystemError = 2,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
};
enum ncclDataType_t { ncclInt64 = 4, ncclFloat32 = 7, ncclFloat64 = 8 };
enum ncclRedOp_t { ncclSum = 0, ncclAvg = 4 };
struct ncclUniqueId {
  char internal[128];
};
using ncclComm_t = struct ncclComm*;

ncclResult_t ncclGetUniqueId(ncclUniqueId* id);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t ncclAllReduce(const void* send, void* recv, std::size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* send, void* recv, std::size_t recvcount,
                               ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t ncclAllGather(const void* send, void* recv, std::size_t sendcount, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* send, void* recv, std::size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream);
const char* ncclGetErrorString(ncclResult_t r);
