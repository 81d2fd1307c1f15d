#include "train/trainer/pipeline_train.h"

namespace tessel::train {

std::unique_ptr<Pipeline> make_pipeline(const TrainConfig& cfg, const models::ModelConfig& mc, const MeshPtr& mesh,
                                        const parallel::ParallelPlan& plan) {
  if (!mesh || !parallel::pipeline::has_pipeline_dim(*mesh)) return nullptr;
  parallel::pipeline::PipelineOptions o;
  o.schedule = cfg.pipeline_schedule;
  o.virtual_stages = int(cfg.virtual_stages > 0 ? cfg.virtual_stages : cfg.pipeline_schedule == "interleaved" ? 2 : 1);
  o.split = cfg.pipeline_split;
  o.compute = cfg.param_dtype();
  std::shared_ptr<models::LanguageModel> model;
  {
    nn::ConstructionScope meta(kMeta);  // no memory: the stage materialises what this rank holds
    model = models::build_model(mc);
  }
  return std::make_unique<Pipeline>(model, mesh, plan, cfg.seed, cfg.micro_batches, o);
}

std::shared_ptr<models::LanguageModel> pipeline_language_model(const Pipeline& pipe) {
  auto lm = std::dynamic_pointer_cast<models::LanguageModel>(pipe.stage().model_ptr());
  TESSEL_CHECK(lm != nullptr, "train", "the pipeline runs a {}, not a models::LanguageModel",
               pipe.model().type_name());
  return lm;
}

double pipeline_forward_backward(Pipeline& pipe, const TrainConfig& cfg, const DataLoader& loader, int64_t step,
                                 std::vector<std::pair<std::string, double>>& extras) {
  std::vector<parallel::pipeline::MicroBatch> mbs;
  for (int64_t m = 0; m < cfg.micro_batches; ++m) {
    Batch b = loader.micro_batch(step, m, cfg.micro_batches);
    mbs.push_back({b.inputs, b.targets, b.first_sample});
  }
  const auto r = pipe.train_step(cfg.seed, uint64_t(step), cfg.batch_size, mbs);
  if (r.aux_loss) extras.emplace_back("aux_loss", *r.aux_loss);
  extras.emplace_back("comm_wait_s", r.comm_wait_s);
  extras.emplace_back("comm_wait_mean_s", r.comm_wait_mean_s);
  return r.loss_sum;
}

std::string pipeline_param_hash(const Pipeline& pipe) { return param_hash(pipe.gather_parameters()); }

}  // namespace tessel::train
