// What a long training run needs besides parity (issue 28): the learning-rate schedules
// against their closed forms, the non-finite guard on every rank of a mesh against the
// one-rank model's first non-finite step, the memory estimate against the executor's measured
// peak, and the measured timeline against the schedule each rank ran.
//
// Catch assertions are not thread-safe: rank threads record, the main thread asserts.

#include <baton/attention/reference.hpp>
#include <baton/comm/local.hpp>
#include <baton/schedule.hpp>
#include <baton/train.hpp>

#include "catch.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <numbers>
#include "train_test_text.hpp"

#include <optional>
#include <string>
#include <vector>

// Names of their own: the test sources are compiled as one unity file.
namespace {

namespace nn = baton::nn;
namespace train = baton::train;
using baton::shard_layout;
using nn::cp_mode;

using train_test::words_corpus;

train::lm_config tiny_config(std::int64_t layers) {
  train::lm_config c;
  c.model = {.d_model = 16, .heads = 4, .kv_heads = 2, .vocab = train::byte_corpus::vocab};
  c.layers = layers;
  c.seq = 16;
  c.batch = 4;
  c.optimizer.lr = 1e-2;
  c.optimizer.eps = 1e-5;
  c.seed = 5;
  return c;
}

// Every parameter the same, shape and value (bit for bit for finite values).
bool same_parameters(const std::map<std::string, baton::host_tensor<float>>& a,
                     const std::map<std::string, baton::host_tensor<float>>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, value] : a) {
    const auto it = b.find(name);
    if (it == b.end() || it->second.shape() != value.shape()) return false;
    for (std::int64_t i = 0; i < value.size(); ++i)
      if (!(it->second[i] == value[i])) return false;
  }
  return true;
}

template <class Policy>
baton::program policy_program(int pp, int microbatches = 4) {
  return Policy::generate(baton::shape_for<Policy>(pp, microbatches));
}

}  // namespace

TEST_CASE("train: learning-rate schedules follow their closed forms", "[train][lr-schedule][checkpoint]") {
  const double peak = 3e-3, floor = 1e-4;
  // The closed forms, written out here independently of lr_schedule::at.
  const auto warm = [&](std::int64_t s, std::int64_t w) { return peak * static_cast<double>(s + 1) / static_cast<double>(w); };
  const auto cosine = [&](std::int64_t s, std::int64_t w, std::int64_t total) {
    const double p = std::min(1.0, static_cast<double>(s - w) / static_cast<double>(total - w));
    return floor + 0.5 * (peak - floor) * (1.0 + std::cos(std::numbers::pi * p));
  };
  const auto linear = [&](std::int64_t s, std::int64_t w, std::int64_t total) {
    const double p = std::min(1.0, static_cast<double>(s - w) / static_cast<double>(total - w));
    return peak - (peak - floor) * p;
  };
  const train::lr_schedule constant{};
  const train::lr_schedule warm_constant{.warmup = 10};
  const train::lr_schedule cos{.decay = train::lr_decay::cosine, .warmup = 10, .total = 100, .min_lr = floor};
  const train::lr_schedule lin{.decay = train::lr_decay::linear, .warmup = 0, .total = 50, .min_lr = floor};
  for (std::int64_t s = 0; s < 130; ++s) {
    INFO("step " << s);
    CHECK(constant.at(s, peak) == peak);
    CHECK(warm_constant.at(s, peak) == Approx(s < 10 ? warm(s, 10) : peak).epsilon(1e-14));
    CHECK(cos.at(s, peak) == Approx(s < 10 ? warm(s, 10) : cosine(s, 10, 100)).epsilon(1e-14));
    CHECK(lin.at(s, peak) == Approx(linear(s, 0, 50)).epsilon(1e-14));
  }
  // Landmarks: the first step already moves, the peak at the end of the warmup, half-way down
  // at the middle of a cosine, the floor from `total` on.
  CHECK(cos.at(0, peak) == Approx(peak / 10));
  CHECK(cos.at(9, peak) == Approx(peak));
  CHECK(cos.at(10, peak) == Approx(peak));
  CHECK(cos.at(55, peak) == Approx((peak + floor) / 2));
  CHECK(cos.at(100, peak) == floor);
  CHECK(lin.at(25, peak) == Approx((peak + floor) / 2));
  // What cannot run says why.
  CHECK_THAT(cos.problem(0.0), Catch::Contains("peak learning rate must be a finite number > 0"));
  CHECK_THAT((train::lr_schedule{.decay = train::lr_decay::cosine, .warmup = 10, .total = 10}.problem(peak)),
             Catch::Contains("needs total (10) > warmup (10)"));
  CHECK_THAT((train::lr_schedule{.min_lr = 1e-4}.problem(peak)), Catch::Contains("the decay is constant"));
  CHECK_THAT((train::lr_schedule{.decay = train::lr_decay::linear, .total = 9, .min_lr = 1}.problem(peak)),
             Catch::Contains("above the peak"));
  CHECK(cos.problem(peak).empty());
}

TEST_CASE("train: the trainers take the schedule's rate at every step, on every rank", "[train][lr-schedule][threads][checkpoint]") {
  train::lm_config config = tiny_config(4);
  config.learning_rate = {.decay = train::lr_decay::cosine, .warmup = 2, .total = 5, .min_lr = 1e-3};
  const train::lm_parallelism parallelism{{.pp = 2, .cp_ring = 2}, cp_mode::ring, shard_layout::zigzag};
  const auto lrs = baton::run_local(4, [&](baton::local_communicator& comm) {
    train::lm_trainer<double, baton::local_communicator, baton::reference_attention> trainer(comm, config, parallelism,
                                                                                            policy_program<baton::zbv>(2));
    std::vector<double> out;
    for (int step = 0; step < 6; ++step) out.push_back(trainer.step(words_corpus().train_batch(step, 4, 16, false)).lr);
    return out;
  });
  train::lm_reference<double, baton::reference_attention> one_rank(config);
  for (int step = 0; step < 6; ++step) {
    const double expected = config.learning_rate.at(step, config.optimizer.lr);
    CHECK(one_rank.step(words_corpus().train_batch(step, 4, 16, false)).lr == expected);
    for (const auto& rank : lrs) CHECK(rank[static_cast<std::size_t>(step)] == expected);
  }
  // A schedule that cannot run is a configuration error, on every rank before any work.
  config.learning_rate.total = 2;
  const auto caught = baton::run_local(4, [&](baton::local_communicator& comm) {
    try {
      train::lm_trainer<double, baton::local_communicator, baton::reference_attention> t(comm, config, parallelism,
                                                                                          policy_program<baton::zbv>(2));
    } catch (const train::config_error& e) {
      return e.setting() + ": " + e.what();
    }
    return std::string();
  });
  for (const auto& c : caught) CHECK_THAT(c, Catch::StartsWith("learning_rate: learning-rate schedule: a cosine decay"));
}

TEST_CASE("train: a run driven to NaN stops on every rank at the first non-finite step", "[train][guard][threads][checkpoint]") {
  // lr 1e30: the first update throws every weight to ~1e30, whose squares overflow float in
  // the next forward. The one-rank model without the guard says which step is the first
  // non-finite one; the mesh must stop exactly there, on every rank, before its update.
  train::lm_config config = tiny_config(4);
  config.optimizer.lr = 1e30;
  const train::lm_parallelism parallelism{{.pp = 2, .cp_ring = 2}, cp_mode::ring, shard_layout::zigzag};
  std::vector<train::lm_batch> batches;
  for (int step = 0; step < 6; ++step) batches.push_back(words_corpus().train_batch(step, 4, 16, false));

  train::lm_config unguarded = config;
  unguarded.stop_on_non_finite = false;
  train::lm_reference<float, baton::reference_attention> one_rank(unguarded);
  std::optional<int> first_bad;
  double last_finite_loss = NAN;
  for (int step = 0; step < 6 && !first_bad; ++step) {
    const train::lm_step_report r = one_rank.step(batches[static_cast<std::size_t>(step)]);
    if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) {
      first_bad = step;
    } else {
      last_finite_loss = r.loss;
    }
  }
  REQUIRE(first_bad);
  REQUIRE(*first_bad >= 1);  // the initial weights are finite: step 0 is

  struct outcome {
    std::int64_t step = -1, last_step = -1;
    double last_loss = NAN;
    std::string what;
    std::map<std::string, baton::host_tensor<float>> last_good, parameters;
  };
  const auto outcomes = baton::run_local(4, [&](baton::local_communicator& comm) {
    train::lm_trainer<float, baton::local_communicator, baton::reference_attention> trainer(comm, config, parallelism,
                                                                                           policy_program<baton::zbv>(2));
    outcome o;
    o.last_good = trainer.parameters();
    try {
      for (const auto& b : batches) {
        trainer.step(b);
        o.last_good = trainer.parameters();  // collective, after every good step
      }
    } catch (const train::non_finite_error& e) {
      o.step = e.step();
      o.last_step = e.last_finite_step().value_or(-1);
      o.last_loss = e.last_finite_loss().value_or(NAN);
      o.what = e.what();
    }
    o.parameters = trainer.parameters();  // collective: every rank stopped at the same step
    return o;
  });
  for (std::size_t r = 0; r < outcomes.size(); ++r) {
    const outcome& o = outcomes[r];
    INFO("rank " << r << ": " << o.what);
    CHECK(o.step == *first_bad);
    CHECK(o.last_step == *first_bad - 1);
    // float on a mesh vs one rank: rounding only (the tolerance of test_train's float cases)
    CHECK(std::abs(o.last_loss - last_finite_loss) <= 1e-5 * std::abs(last_finite_loss));
    CHECK_THAT(o.what, Catch::StartsWith("step " + std::to_string(*first_bad) + ": the loss is ") &&
                           Catch::Contains("(last finite loss ") &&
                           Catch::Contains("the parameters are those after step " + std::to_string(*first_bad - 1)) &&
                           Catch::Contains("lower the learning rate") && Catch::Contains("check the data"));
    // The update of the non-finite step was not taken: the weights are, bit for bit, those
    // after the last good step, and finite.
    CHECK(same_parameters(o.parameters, o.last_good));
    bool finite = true;
    for (const auto& [name, value] : o.parameters)
      for (std::int64_t i = 0; i < value.size(); ++i) finite = finite && std::isfinite(value[i]);
    CHECK(finite);
  }
}

TEST_CASE("train: the memory estimate covers the measured peak of saved activations", "[train][memory][threads][checkpoint]") {
  // estimate_memory's peak_saved walks each rank's program; the executor measures the bytes
  // of the saved states alive at its peak. Both count the same tensors, so they agree to
  // within 1 % (measured: equal); the bound allows the estimate's rounding of uneven
  // microbatches and shards upwards.
  struct scenario {
    const char* name;
    train::lm_parallelism parallelism;
    baton::program schedule;
  };
  train::lm_config config = tiny_config(8);
  config.model.d_model = 32;
  config.seq = 32;
  config.batch = 8;
  const std::vector<scenario> scenarios{
      {"pp2 x cp2 ZBV", {{.pp = 2, .cp_ring = 2}, cp_mode::ring, shard_layout::zigzag}, policy_program<baton::zbv>(2)},
      {"pp4 1F1B", {{.pp = 4}, cp_mode::none, shard_layout::zigzag}, policy_program<baton::one_f_one_b>(4)},
      {"pp2 GPipe", {{.pp = 2, .dp = 2}, cp_mode::none, shard_layout::zigzag}, policy_program<baton::gpipe>(2)},
  };
  for (const scenario& s : scenarios) {
    const auto measured = baton::run_local(s.parallelism.mesh.size(), [&](baton::local_communicator& comm) {
      train::lm_trainer<float, baton::local_communicator, baton::reference_attention> trainer(comm, config, s.parallelism,
                                                                                             s.schedule);
      return trainer.step(words_corpus().train_batch(0, config.batch * s.parallelism.mesh.dp, config.seq, false)).peak_saved_bytes;
    });
    const auto estimate = train::estimate_memory(config, s.parallelism, s.schedule, sizeof(float));
    double most = 0;
    for (const auto& e : estimate) most = std::max(most, e.peak_saved);
    INFO(s.name << ": estimated " << most << " bytes, measured " << measured[0]);
    CHECK(most >= 0.99 * static_cast<double>(measured[0]));
    CHECK(most <= 1.01 * static_cast<double>(measured[0]));
    for (const auto& e : estimate) {
      CHECK(e.gradients == e.parameters);
      CHECK(e.optimizer == 2 * e.parameters);
    }
  }
  // An absurd model is a finite, absurd number, not an overflow.
  train::lm_config huge = config;
  huge.model = {.d_model = std::int64_t{1} << 40, .heads = 1, .kv_heads = 1, .vocab = 256};
  const auto e = train::estimate_memory(huge, {{.pp = 1}, cp_mode::none, shard_layout::zigzag},
                                        policy_program<baton::gpipe>(1), sizeof(float));
  CHECK(std::isfinite(e[0].total()));
  CHECK(e[0].total() > 1e24);
  CHECK(train::available_memory().value_or(1.0) > 0);
}

TEST_CASE("train: the measured timeline holds every action of the step, in each rank's order", "[train][timeline][threads][checkpoint]") {
  const train::lm_config config = tiny_config(4);
  const train::lm_parallelism parallelism{{.pp = 2, .cp_ring = 2}, cp_mode::ring, shard_layout::zigzag};
  const baton::program schedule = policy_program<baton::zbv>(2);
  struct gathered {
    std::vector<std::vector<baton::action_event>> events;
    std::vector<baton::action_time> times;
    double pipeline_seconds = 0;
  };
  const auto results = baton::run_local(4, [&](baton::local_communicator& comm) {
    train::lm_trainer<float, baton::local_communicator, baton::reference_attention> trainer(comm, config, parallelism,
                                                                                           schedule);
    const auto r = trainer.step(words_corpus().train_batch(0, 4, 16, false));
    gathered g;
    g.events = train::gather_action_events(comm, r.action_events);
    g.times = train::gather_action_times(comm, r.action_times, 4);
    g.pipeline_seconds = r.pipeline_seconds;
    return g;
  });
  const auto& events = results[0].events;
  REQUIRE(events.size() == 4);
  for (const auto& other : results) CHECK(other.events == events);  // the same table on every rank
  for (int world_rank = 0; world_rank < 4; ++world_rank) {
    // The mesh puts pp fastest-varying last (cp_ulysses fastest): world rank = pp x cp + cp_ring.
    const int pp_rank = world_rank / 2;
    std::vector<baton::action> expected;
    for (const baton::action& a : schedule.ranks[static_cast<std::size_t>(pp_rank)])
      if (baton::is_compute(a.kind)) expected.push_back(a);
    const auto& mine = events[static_cast<std::size_t>(world_rank)];
    INFO("world rank " << world_rank);
    REQUIRE(mine.size() == expected.size());  // ZBV, 2 stages x 4 microbatches x F, I, W
    CHECK(mine.size() == 24);
    double previous = 0;
    for (std::size_t i = 0; i < mine.size(); ++i) {
      CHECK(mine[i].kind == expected[i].kind);
      CHECK(mine[i].stage == expected[i].stage);
      CHECK(mine[i].microbatch == expected[i].microbatch);
      CHECK(mine[i].start >= previous);  // one after the other, none overlapping
      CHECK(mine[i].finish >= mine[i].start);
      CHECK(mine[i].finish <= results[0].pipeline_seconds * 1.01 + 1e-3);
      previous = mine[i].finish;
    }
  }
  // As a simulation: a row per world rank, every action, in milliseconds; the trace format of
  // the simulator's renderer, with the simulated step beside it.
  const baton::simulation measured = train::measured_timeline(events, schedule.shape);
  CHECK(measured.ranks.size() == 4);
  CHECK(measured.timeline.size() == 96);
  CHECK(measured.makespan > 0);
  CHECK(measured.bubble_ratio >= 0);
  CHECK(measured.bubble_ratio < 1);
  const baton::simulation simulated = train::simulated_timeline(schedule, results[0].times);
  CHECK(simulated.ranks.size() == 2);
  CHECK(simulated.makespan > 0);
  const std::string trace = train::measured_vs_simulated_trace(measured, simulated, "step 0");
  CHECK(trace.rfind("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", 0) == 0);
  CHECK(trace.find("\"pid\":1,\"tid\":1") != std::string::npos);
  CHECK(trace.substr(trace.size() - 4) == "\n]}\n");
  const std::string svg = train::measured_vs_simulated_svg(measured, simulated, "step 0");
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(svg.find("simulated from the same step's measured costs") != std::string::npos);
  // Every stage's times, summed over the ranks that hold it (2 cp ranks x 4 microbatches).
  for (const baton::action_time& t : results[0].times) {
    CHECK(t.count == 8);
    CHECK(t.seconds > 0);
  }
  CHECK(results[0].times.size() == 12);  // 4 stages x F, I, W
}

TEST_CASE("train: a metrics line is one JSON object with the step's figures", "[train][metrics][checkpoint]") {
  train::lm_step_report r;
  r.loss = 2.5;
  r.lr = 1e-3;
  r.tokens = 100;
  r.seconds = 0.5;
  r.pipeline_seconds = 0.45;  // the pp group's longest: not in the line
  r.own_pipeline_seconds = 0.4;
  r.data_seconds = 0.005;
  r.report_seconds = 0.002;
  r.sync_seconds = 0.05;
  r.optimizer_seconds = 0.04;
  r.grad_norm = NAN;  // JSON has no NaN: null
  r.peak_host_bytes = 123456;
  r.minor_faults = 42;
  const std::vector<baton::action_time> times{{0, baton::action_kind::forward, 4, 0.2},
                                              {1, baton::action_kind::backward_weight, 2, 0.1}};
  const std::string line = train::to_json_line({.step = 7, .report = &r, .stage_times = times, .num_stages = 2,
                                                .elapsed = 3, .eval_loss = 2.25, .predicted_peak_bytes = std::nullopt});
  CHECK(line == "{\"step\":7,\"loss\":2.5,\"lr\":0.001,\"tokens\":100,\"tokens_per_s\":200,\"grad_norm\":null,"
                "\"bubble\":0,\"peak_saved_bytes\":0,\"peak_host_bytes\":123456,\"minor_faults\":42,\"step_s\":0.5,\"data_s\":0.005,\"pipeline_s\":0.4,\"sync_s\":0.05,"
                "\"optimizer_s\":0.04,\"report_s\":0.002,\"elapsed_s\":3,\"eval_loss\":2.25,\"stages\":[{\"stage\":0,\"F_s\":0.05,"
                "\"B_s\":0,\"I_s\":0,\"W_s\":0},{\"stage\":1,\"F_s\":0,\"B_s\":0,\"I_s\":0,\"W_s\":0.05}]}");
  // With the predicted peak (baton-train: estimate_memory's), it follows the measured one.
  const std::string predicted = train::to_json_line({.step = 7, .report = &r, .stage_times = times, .num_stages = 2,
                                                     .elapsed = 3, .eval_loss = std::nullopt, .predicted_peak_bytes = 120000.0});
  CHECK(predicted.find("\"peak_host_bytes\":123456,\"predicted_peak_bytes\":120000,\"minor_faults\":42,") != std::string::npos);
}

TEST_CASE("train docs: a schedule, the guard, and the gradients after step", "[train][docs][lr-schedule][threads][checkpoint]") {
  std::string path_free_text;
  for (int i = 0; i < 400; ++i) path_free_text += "tokens flow through stages around the ring. ";
  const train::byte_corpus corpus(path_free_text);
  train::lm_config config;
  config.model = {.d_model = 32, .heads = 4, .kv_heads = 2, .vocab = train::byte_corpus::vocab};
  config.layers = 4;
  config.seq = 32;
  config.batch = 4;
  const train::lm_parallelism parallelism{.mesh = {.pp = 2, .cp_ring = 2}, .cp = baton::nn::cp_mode::ring,
                                          .layout = baton::shard_layout::zigzag};
  const baton::program schedule = baton::zbv::generate(baton::shape_for<baton::zbv>(2, 4));

  // [doc:train_schedule_guard]
  struct rank_result {
    std::vector<double> rates, norms, squares;
    std::string stopped;
  };
  config.optimizer = {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-5, .weight_decay = 0.1};
  config.learning_rate = {.decay = train::lr_decay::cosine, .warmup = 2, .total = 6, .min_lr = 3e-4};
  config.clip_norm = 1.0;

  const auto runs = baton::run_local(4, [&](baton::local_communicator& world) {
    train::lm_trainer<double, baton::local_communicator, baton::reference_attention> trainer(world, config,
                                                                                            parallelism, schedule);
    rank_result out;
    try {
      for (int step = 0; step < 6; ++step) {
        const train::lm_step_report r = trainer.step(corpus.train_batch(step, 4, 32, false));
        out.rates.push_back(r.lr);  // config.learning_rate.at(step, config.optimizer.lr)
        out.norms.push_back(r.grad_norm);  // before clipping, over the whole model
        // After step() every local parameter's grad holds this step's gradient, summed over
        // the replicas and clipped (the next step zeroes it); this rank's stages only.
        double squares = 0;
        for (const auto& g : baton::nn::gradient_spans(trainer.local_parameters()))
          for (const double x : g) squares += x * x;
        out.squares.push_back(squares);
      }
    } catch (const train::non_finite_error& e) {  // on every rank at the same step, before its update
      out.stopped = e.what();
    }
    return out;
  });
  // [/doc:train_schedule_guard]

  for (const rank_result& r : runs) {
    CHECK(r.stopped.empty());
    REQUIRE(r.rates.size() == 6);
    for (int step = 0; step < 6; ++step) {
      // The closed form, written out: warmup 3e-3 (s + 1) / 2, then the cosine to 3e-4 at 6.
      const double expected = step < 2 ? 3e-3 * (step + 1) / 2
                                       : 3e-4 + (3e-3 - 3e-4) * (1 + std::cos(std::numbers::pi * (step - 2) / 4.0)) / 2;
      CHECK(r.rates[static_cast<std::size_t>(step)] == Approx(expected).epsilon(1e-14));
    }
  }
  // The clipped gradient's norm over both pipeline ranks: min(1, 1 / (norm + 1e-6)) x norm
  // (clip_grad_norm's coefficient), to double rounding (sums in another order: 1e-12).
  for (std::size_t step = 0; step < 6; ++step) {
    double squares = 0;
    for (const rank_result& r : runs) squares += r.squares[step] / 2;  // each pp rank's gradients on its 2 cp ranks
    const double norm = runs[0].norms[step];
    INFO("step " << step << ": norm " << norm);
    CHECK(std::sqrt(squares) == Approx(norm * std::min(1.0, 1.0 / (norm + 1e-6))).epsilon(1e-12));
  }
}
