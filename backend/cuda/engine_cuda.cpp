// Registers the "cuda" engine with the run loop's seam (engine.hpp). Compiled into every target
// that links moeplan::backend_cuda (an INTERFACE source), so no linker drops the registration.
// Data parallelism: when WORLD_SIZE is set the engine joins an NCCL group (RANK, LOCAL_RANK; the
// unique id travels through MOEPLAN_NCCL_ID_FILE, default /tmp/moeplan-nccl-<MASTER_PORT|id>).
#include <cstdlib>
#include <memory>
#include <string>

#include "moeplan/accounting/error.hpp"
#include "moeplan/backend/cuda/comm.hpp"
#include "moeplan/backend/cuda/device.hpp"
#include "moeplan/backend/cuda/model.hpp"
#include "moeplan/backend/engine.hpp"

namespace moeplan::backend::cuda {
namespace {

std::string nccl_id_file() {
  if (const char* f = std::getenv("MOEPLAN_NCCL_ID_FILE"); f && *f) return f;
  const char* port = std::getenv("MASTER_PORT");
  return std::string("/tmp/moeplan-nccl-") + (port && *port ? port : "id");
}

class CudaEngine final : public Engine {
 public:
  explicit CudaEngine(const EngineRequest& r) {
    if (device_count() == 0)
      throw InputError("--device cuda: no CUDA device is visible on this machine");
    if (std::getenv("WORLD_SIZE")) {
      const RankInfo info = rank_from_env();
      comm_ = std::make_unique<Communicator>(info, nccl_id_file());
    }
    model_ =
        std::make_unique<Model>(r.arch, r.options, r.seed, r.batch_seqs, DType::bf16, comm_.get());
  }
  std::string device() const override { return "cuda"; }
  StepResult train_step(const int32_t* inputs, const int32_t* targets, int64_t step,
                        const OptimConfig& cfg) override {
    return model_->train_step(inputs, targets, step, cfg);
  }
  double forward_loss(const int32_t* inputs, const int32_t* targets, int64_t n_seqs,
                      double* per_position_loss) override {
    return model_->forward_loss(inputs, targets, n_seqs, per_position_loss);
  }
  std::vector<char> save_state() const override {
    std::vector<char> out;
    model_->save_state(out);
    return out;
  }
  void load_state(const std::vector<char>& state) override { model_->load_state(state); }
  std::vector<TensorInfo> tensors() const override { return model_->tensors(); }
  int64_t trainable_params() const override { return model_->trainable_params(); }
  FlopLedger eval_ledger() const override { return model_->eval_ledger(); }

 private:
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Model> model_;
};

const bool registered = register_engine("cuda", [](const EngineRequest& r) {
  return std::unique_ptr<Engine>(std::make_unique<CudaEngine>(r));
});

}  // namespace
}  // namespace moeplan::backend::cuda
