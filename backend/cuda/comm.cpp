#include "moeplan/backend/cuda/comm.hpp"

#include <cuda_runtime.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"
#include "moeplan/accounting/error.hpp"
#include "moeplan/backend/cuda/device.hpp"

namespace moeplan::backend::cuda {
namespace {

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess)
    throw std::runtime_error(fmt::format("NCCL error in {}: {}", what, ncclGetErrorString(r)));
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > 1 << 20)
    throw InputError(fmt::format("environment {}='{}' is not a non-negative integer", name, v));
  return int(x);
}

}  // namespace

RankInfo rank_from_env() {
  auto given = [](const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0';
  };
  RankInfo r;
  if (!given("WORLD_SIZE")) {
    // RANK or LOCAL_RANK alone: one process would train alone on GPU 0, the variables ignored.
    for (const char* name : {"RANK", "LOCAL_RANK"})
      if (given(name))
        throw InputError(fmt::format(
            "{}={} is set but WORLD_SIZE is not: set WORLD_SIZE too (torchrun sets WORLD_SIZE, "
            "RANK and LOCAL_RANK), or unset {} to train in one process",
            name, std::getenv(name), name));
    return r;
  }
  r.world_size = env_int("WORLD_SIZE", 1);
  if (r.world_size < 1)
    throw InputError(fmt::format("WORLD_SIZE={} must be at least 1", r.world_size));
  // Every rank of a job must say which it is: two processes without RANK were both rank 0.
  if (r.world_size > 1 && !given("RANK"))
    throw InputError(fmt::format(
        "WORLD_SIZE={} but RANK is not set: give each process its RANK (0 to {}), as torchrun "
        "does, or let `moeplan run --nproc {}` start them",
        r.world_size, r.world_size - 1, r.world_size));
  r.rank = env_int("RANK", 0);
  r.local_rank_given = given("LOCAL_RANK");
  r.local_rank = env_int("LOCAL_RANK", r.rank);
  if (r.rank >= r.world_size)
    throw InputError(fmt::format("RANK={} must be below WORLD_SIZE={}", r.rank, r.world_size));
  return r;
}

int64_t windows_of_rank(int64_t windows, int rank, int world_size) {
  if (rank >= windows) return 0;
  return (windows - 1 - rank) / world_size + 1;
}

int64_t rank_batch(int64_t batch, const RankInfo& rank) {
  if (batch < rank.world_size)
    throw InputError(fmt::format(
        "batch_seqs {} is smaller than WORLD_SIZE={}; every rank needs at least one sequence",
        batch, rank.world_size));
  return windows_of_rank(batch, rank.rank, rank.world_size);
}

void take_rank_share(std::vector<int32_t>& out, const int32_t* global, int64_t batch,
                     int64_t seq_len, const RankInfo& rank) {
  const int64_t local = windows_of_rank(batch, rank.rank, rank.world_size);
  out.resize(size_t(local * seq_len));
  for (int64_t i = 0; i < local; ++i)
    std::copy_n(global + window_of_rank(i, rank.rank, rank.world_size) * seq_len, seq_len,
                out.begin() + ptrdiff_t(i * seq_len));
}

struct Communicator::Impl {
  RankInfo info;
  ncclComm_t comm = nullptr;
  // Allocated in the constructor, after set_device: a buffer made here would make its context
  // on GPU 0 for every rank (7 extra contexts on GPU 0 at --nproc 8).
  DeviceBuffer staging;
};

namespace {
// Rank 0's hand-over of the NCCL id: a new temp file beside `path` (O_EXCL: never one another user
// planted), written whole and synced, then renamed over `path`. rename replaces a link at `path`
// itself, never the file it points to (a link planted in /tmp would have had its target
// overwritten), and a write that fails (a full /tmp) is said here, not published as a short file
// the other ranks wait on until their timeout. A folder that cannot take it (the user's
// MOEPLAN_NCCL_ID_FILE) is unusable input; a failed write of a file made is not.
void publish_id(const std::string& path, const void* bytes, size_t n) {
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    throw InputError(
        fmt::format("rank 0 cannot create the NCCL id file '{}' ({}); set "
                    "MOEPLAN_NCCL_ID_FILE to a path in a writable folder",
                    tmp, std::strerror(errno)));
  const bool written = ::write(fd, bytes, n) == ssize_t(n) && ::fsync(fd) == 0;
  const int err = errno;
  if (::close(fd) != 0 || !written || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = written ? errno : err;
    ::unlink(tmp.c_str());
    throw std::runtime_error(
        fmt::format("rank 0 could not write the NCCL id file '{}' ({})", path, std::strerror(e)));
  }
}
}  // namespace

Communicator::Communicator(const RankInfo& info, const std::string& id_file, double timeout_seconds)
    : impl_(std::make_unique<Impl>()) {
  impl_->info = info;
  set_device(info.local_rank);
  impl_->staging = DeviceBuffer(64 * sizeof(int64_t));
  ncclUniqueId id;
  if (info.rank == 0) {
    check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    publish_id(id_file, &id, sizeof id);
  } else {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      std::ifstream f(id_file, std::ios::binary);
      if (f && f.read(reinterpret_cast<char*>(&id), sizeof id)) break;
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > timeout_seconds)  // rank 0 failed or never started: not the user's input
        throw std::runtime_error(fmt::format(
            "rank {}: no NCCL id in '{}' from rank 0 after {:.0f} s", info.rank, id_file, waited));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  check_nccl(ncclCommInitRank(&impl_->comm, info.world_size, id, info.rank), "ncclCommInitRank");
  // Every rank has read the id (initialisation is collective), so rank 0 removes the file; the
  // all-reduce after it keeps any rank from going on before it is gone. Without this, the next
  // communicator of the same job (the next point of a sweep) could be joined through this one's
  // stale id by a rank that gets there before rank 0 rewrites the file.
  if (info.rank == 0) std::remove(id_file.c_str());
  int64_t joined = 1;
  all_reduce_sum_host(&joined, 1);
  if (joined != info.world_size) {
    ncclCommAbort(impl_->comm);  // the destructor does not run for a constructor that throws
    impl_->comm = nullptr;
    throw std::runtime_error(
        fmt::format("NCCL group of {} rank(s) counted {} at start-up", info.world_size, joined));
  }
}

Communicator::~Communicator() {
  if (!impl_ || !impl_->comm) return;
  // Unwinding from an error, the other ranks may be inside a collective this rank never joins:
  // ncclCommDestroy waits for queued work and could wait for ever; abort does not.
  if (std::uncaught_exceptions() > 0)
    ncclCommAbort(impl_->comm);
  else
    ncclCommDestroy(impl_->comm);
}

const RankInfo& Communicator::info() const {
  return impl_->info;
}

void Communicator::all_reduce_sum(float* d, int64_t n) {
  check_nccl(ncclAllReduce(d, d, size_t(n), ncclFloat32, ncclSum, impl_->comm, nullptr),
             "ncclAllReduce(float)");
}
void Communicator::all_reduce_mean(float* d, int64_t n, void* stream) {
  check_nccl(ncclAllReduce(d, d, size_t(n), ncclFloat32, ncclAvg, impl_->comm,
                           static_cast<cudaStream_t>(stream)),
             "ncclAllReduce(float, avg)");
}
void Communicator::all_reduce_sum(double* d, int64_t n) {
  check_nccl(ncclAllReduce(d, d, size_t(n), ncclFloat64, ncclSum, impl_->comm, nullptr),
             "ncclAllReduce(double)");
}
void Communicator::all_reduce_sum(int64_t* d, int64_t n) {
  check_nccl(ncclAllReduce(d, d, size_t(n), ncclInt64, ncclSum, impl_->comm, nullptr),
             "ncclAllReduce(int64)");
}

void Communicator::reduce_scatter_mean(float* d, int64_t chunk) {
  float* mine = d + int64_t(impl_->info.rank) * chunk;
  check_nccl(ncclReduceScatter(d, mine, size_t(chunk), ncclFloat32, ncclAvg, impl_->comm, nullptr),
             "ncclReduceScatter(float, avg)");
}
void Communicator::all_gather(float* d, int64_t chunk) {
  const float* mine = d + int64_t(impl_->info.rank) * chunk;
  check_nccl(ncclAllGather(mine, d, size_t(chunk), ncclFloat32, impl_->comm, nullptr),
             "ncclAllGather(float)");
}
void Communicator::broadcast(float* d, int64_t n, int root) {
  check_nccl(ncclBroadcast(d, d, size_t(n), ncclFloat32, root, impl_->comm, nullptr),
             "ncclBroadcast(float)");
}

void Communicator::all_reduce_sum_host(int64_t* h, int64_t n) {
  for (int64_t done = 0; done < n; done += 64) {
    const int64_t m = std::min<int64_t>(64, n - done);
    impl_->staging.upload(h + done, size_t(m) * 8);
    all_reduce_sum(impl_->staging.as<int64_t>(), m);
    impl_->staging.download(h + done, size_t(m) * 8);
  }
}
void Communicator::all_reduce_sum_host(FlopLedger& ledger, std::vector<int64_t*> extra) {
  // One step's or one evaluation's counts: 64 bits hold them (to_int64 refuses what does not).
  std::vector<int64_t> c;
  for (const auto& row : ledger.flops)
    for (FlopCount v : row) c.push_back(v.to_int64());
  c.push_back(ledger.elementwise.to_int64());
  for (const int64_t* e : extra) c.push_back(*e);
  all_reduce_sum_host(c.data(), int64_t(c.size()));
  size_t i = 0;
  for (auto& row : ledger.flops)
    for (auto& v : row) v = c[i++];
  ledger.elementwise = c[i++];
  for (int64_t* e : extra) *e = c[i++];
}

void Communicator::all_reduce_sum_host(double* h, int64_t n) {
  for (int64_t done = 0; done < n; done += 64) {
    const int64_t m = std::min<int64_t>(64, n - done);
    impl_->staging.upload(h + done, size_t(m) * 8);
    all_reduce_sum(impl_->staging.as<double>(), m);
    impl_->staging.download(h + done, size_t(m) * 8);
  }
}

}  // namespace moeplan::backend::cuda
