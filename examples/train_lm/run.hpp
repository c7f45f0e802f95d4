// One rank of baton-train, for any communicator: build the trainer, train (with --check, the
// metrics, the trace, the held-out evaluations, the checkpoint hooks and the agreement to stop
// on a signal), evaluate, generate.
#pragma once

#include "checkpoint.hpp"
#include "options.hpp"
#include "signals.hpp"

#include <baton/attention/reference.hpp>
#include <baton/config.hpp>
#include <baton/nn/blas.hpp>
#include <baton/schedule/render.hpp>
#include <baton/train.hpp>
#if BATON_HAS_KOKKOS()
#include <baton/attention/kokkos.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace train_lm {

inline std::string example_number(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", x);
  return text;
}

// "1:05" or "2:03:07".
inline std::string clock_text(double seconds) {
  const auto s = static_cast<long long>(std::max(0.0, seconds) + 0.5);
  char text[32];
  if (s >= 3600)
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(text, sizeof text, "%lld:%02lld", s / 60, s % 60);
  return text;
}

// --check's tolerance on the worst parameter difference relative to the largest parameter, and
// why (docs/training.md, "--check"): double 1e-10, the mesh sums the same terms in other
// orders; float 1e-5 with AdamW's eps >= 1e-5. With a smaller eps an element whose gradient is
// float rounding noise moves by up to lr either way in one step whatever the noise, so the
// bound is 2 lr / the largest parameter.
inline std::pair<double, std::string> check_tolerance(const options& o, double lr, double largest) {
  if (o.check_tolerance > 0) return {o.check_tolerance, "--check-tolerance"};
  if (o.dtype == "double") return {1e-10, "double: sums in another order"};
  if (o.adamw_eps() >= 1e-5) return {1e-5, "float, AdamW eps >= 1e-5"};
  return {std::max(1e-5, 2 * lr / std::max(largest, 1e-30)), "float with AdamW eps < 1e-5: 2 lr / largest"};
}

// What a rank's run ends with: an exit_code, or 128 + a signal.
template <class T, class Backend, class Comm>
int run_rank(Comm& world, const options& o, const prepared& prep, std::FILE* metrics) {
  namespace train = baton::train;
  const bool lead = world.rank() == 0;
  const auto say = [&](const char* fmt, auto... args) {
    if (lead) {
      std::printf(fmt, args...);
      std::fflush(stdout);
    }
  };
  train::lm_config config = o.config();
  config.stage_recompute = prep.stage_recompute;  // --recompute auto: the plan's (prepare)
  const train::lm_parallelism parallelism = o.parallelism();
  const train::byte_corpus& corpus = *prep.corpus;
  // prepare() checked the configuration: the trainer's own check (every rank alike) passes.
  train::lm_trainer<T, Comm, Backend> trainer(world, config, parallelism, prep.schedule);
  const auto& shape = trainer.executor().lowered_program().shape;
  const int stages = shape.num_stages();
  say("baton-train: %d ranks = %s, cp %s (%s), schedule %s: %d stages on %d ranks, %d microbatches\n", world.size(),
      parallelism.mesh.text().c_str(), std::string(baton::nn::to_string(o.cp_mode)).c_str(),
      std::string(baton::to_string(o.layout)).c_str(), o.schedule.c_str(), stages, shape.ranks, shape.microbatches);
  const std::string products =
      o.bf16_matmul() ? ", bf16 products (" + baton::nn::bf16_matmul_kernel() + ")" : "";
  say("model: %lld layers, d_model %lld, %lld heads / %lld kv heads, vocab 256 (bytes), %s%s; %s attention; "
      "OpenBLAS kernel %s\n",
      static_cast<long long>(o.layers), static_cast<long long>(o.d_model), static_cast<long long>(o.heads),
      static_cast<long long>(o.kv_heads), o.dtype.c_str(), products.c_str(), o.backend.c_str(),
      baton::nn::blas_kernel().c_str());
  say("data: %s (%lld bytes%s), seq %lld, %lld rows per step (%lld per dp replica)\n", o.data.c_str(),
      static_cast<long long>(corpus.size()), o.packed ? ", packed paragraphs with a document mask" : "",
      static_cast<long long>(o.seq), static_cast<long long>(o.batch * o.dp), static_cast<long long>(o.batch));
  {
    std::string schedule_text = std::string(train::to_string(config.learning_rate.decay));
    if (config.learning_rate.warmup > 0)
      schedule_text = std::to_string(config.learning_rate.warmup) + " warmup steps, then " + schedule_text;
    if (config.learning_rate.decay != train::lr_decay::constant)
      schedule_text += " to " + example_number(config.learning_rate.min_lr);
    say("optimizer: AdamW, lr %g (%s), betas %g, %g, eps %g, weight decay %g; clip %s\n", config.optimizer.lr,
        schedule_text.c_str(), config.optimizer.beta1, config.optimizer.beta2, config.optimizer.eps,
        config.optimizer.weight_decay, o.clip > 0 ? example_number(o.clip).c_str() : "off");
  }
  say("%s%s\n", prep.plan_text.c_str(), prep.memory_line.c_str());

  const std::int64_t rows = o.batch * o.dp;
  const std::int64_t first = checkpoint::resume(trainer, o);  // HOOK: 0 without --resume
  const int trace_step = o.trace.empty() ? -1 : (o.trace_step >= 0 ? o.trace_step : o.steps - 1);
  double first_loss = NAN, last_loss = NAN;
  const auto started = std::chrono::steady_clock::now();
  const auto say_saved = [&](const std::string& dir) {
    if (!dir.empty()) say("checkpoint: %s\n", dir.c_str());
  };

  for (std::int64_t step = first; step < o.steps; ++step) {
    const train::lm_batch batch = corpus.train_batch(step, rows, o.seq, o.packed);
    train::lm_step_report r;
    try {
      r = trainer.step(batch);
    } catch (const train::non_finite_error& e) {
      // Every rank meets it at the same step (the loss and the norm are the same everywhere).
      if (lead) std::fprintf(stderr, "baton-train: stopped: %s\n", e.what());
      return exit_code::non_finite;
    }
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (std::isnan(first_loss)) first_loss = r.loss;
    last_loss = r.loss;

    if (o.check && step == 0) {
      // The step just taken on the mesh, taken again by the same model on one rank (rank 0),
      // every parameter compared; every rank learns the verdict.
      auto mesh_params = trainer.parameters();
      std::int32_t pass = 1;
      if (lead) {
        train::lm_reference<T, Backend> reference(config);
        const auto ref_report = reference.step(batch);
        double worst = 0, largest = 0;
        for (const auto& [name, value] : reference.parameters()) {
          const auto& mine = mesh_params.at(name);
          for (std::int64_t i = 0; i < value.size(); ++i) {
            worst = std::max(worst, std::abs(static_cast<double>(mine[i]) - static_cast<double>(value[i])));
            largest = std::max(largest, std::abs(static_cast<double>(value[i])));
          }
        }
        const double relative = largest > 0 ? worst / largest : worst;
        const auto [tolerance, why] = check_tolerance(o, r.lr, largest);
        const double loss_relative = std::abs(r.loss - ref_report.loss) / std::max(std::abs(ref_report.loss), 1e-300);
        pass = relative <= tolerance && loss_relative <= tolerance ? 1 : 0;
        std::printf("check: step 0 loss %.10f on the mesh, %.10f on one rank; worst parameter difference %.2e (%.2e "
                    "relative to the largest); tolerance %.1e (%s): %s\n",
                    r.loss, ref_report.loss, worst, relative, tolerance, why.c_str(), pass ? "PASS" : "FAIL");
        if (!pass)
          std::fprintf(stderr, "baton-train: --check: the mesh does not train like one rank beyond the tolerance; "
                               "please report this command line\n");
        std::fflush(stdout);
      }
      world.broadcast(std::span<std::int32_t>(&pass, 1), 0);
      if (!pass) return exit_code::check_failed;
    }

    std::optional<double> eval_loss;
    if (o.eval_every > 0 && (step + 1) % o.eval_every == 0 && step + 1 < o.steps)
      eval_loss = trainer.eval(corpus.eval_batch(rows, o.seq, o.packed)).loss;
    if (!o.metrics.empty()) {
      train::step_metrics m;
      m.step = step;
      m.report = &r;
      m.stage_times = train::gather_action_times(world, r.action_times, stages);  // collective
      m.num_stages = stages;
      m.elapsed = elapsed;
      m.eval_loss = eval_loss;
      if (!prep.memory.empty()) m.predicted_peak_bytes = prep.memory.front().total();  // world rank 0 is pp rank 0
      if (metrics != nullptr) {
        const std::string line = train::to_json_line(m) + "\n";
        std::fputs(line.c_str(), metrics);
        std::fflush(metrics);  // a run that dies keeps every line it wrote
      }
    }
    if (step == trace_step) {
      const auto events = train::gather_action_events(world, r.action_events);  // collective
      const auto times = train::gather_action_times(world, r.action_times, stages);
      if (lead) {
        const baton::simulation measured = train::measured_timeline(events, prep.schedule.shape);
        const baton::simulation simulated = train::simulated_timeline(prep.schedule, times);
        const std::string title = "step " + std::to_string(step) + ", " + o.schedule + ", pp " + std::to_string(o.pp) +
                                  " x dp " + std::to_string(o.dp) + " x cp " + std::to_string(o.cp);
        const bool svg = o.trace.size() > 4 && o.trace.compare(o.trace.size() - 4, 4, ".svg") == 0;
        const std::string text = svg ? train::measured_vs_simulated_svg(measured, simulated, title)
                                     : train::measured_vs_simulated_trace(measured, simulated, title);
        if (std::FILE* f = std::fopen(o.trace.c_str(), "wb")) {
          std::fwrite(text.data(), 1, text.size(), f);
          std::fclose(f);
          say("trace: step %lld written to %s (measured makespan %.3g ms, simulated %.3g ms)\n",
              static_cast<long long>(step), o.trace.c_str(), measured.makespan, simulated.makespan);
        } else {
          std::fprintf(stderr, "baton-train: cannot write --trace %s\n", o.trace.c_str());
        }
      }
    }
    if (step % o.log_every == 0 || step + 1 == o.steps) {
      const double done = static_cast<double>(step + 1 - first);
      const double eta = elapsed / done * static_cast<double>(o.steps - step - 1);
      say("step %4lld | loss %.*f | %6.0f tok/s | bubble %.3f | saved %.2f MiB | grad norm %.3f | lr %.2e | %s, "
          "ETA %s\n",
          static_cast<long long>(step), o.loss_digits, r.loss, static_cast<double>(r.tokens) / r.seconds,
          r.bubble_fraction, static_cast<double>(r.peak_saved_bytes) / (1 << 20), r.grad_norm, r.lr,
          clock_text(elapsed).c_str(), clock_text(eta).c_str());
    }
    if (eval_loss) say("eval after step %lld | held-out loss %.4f\n", static_cast<long long>(step), *eval_loss);
    if (!o.save.empty() && o.save_every > 0 && (step + 1) % o.save_every == 0 && step + 1 < o.steps)
      say_saved(checkpoint::save(trainer, o, step + 1, "every"));  // HOOK

    // A signal reaches one thread (or one process) at any moment: the ranks agree on it once
    // per step, so that all of them stop after the same step.
    std::int32_t stop = signals::received();
    world.all_reduce(std::span<std::int32_t>(&stop, 1), baton::reduce_op::max);
    if (stop != 0) {
      const std::string saved = o.save.empty() ? std::string() : checkpoint::save(trainer, o, step + 1, "signal");  // HOOK
      say("baton-train: %s: stopped after step %lld of %d (0-based; the step finished on every rank); %s\n",
          stop == SIGINT ? "SIGINT" : stop == SIGTERM ? "SIGTERM" : "signal", static_cast<long long>(step), o.steps,
          saved.empty() ? "no checkpoint written (--save DIR keeps the run)" : ("checkpoint: " + saved).c_str());
      return 128 + stop;
    }
  }

  const auto eval = trainer.eval(corpus.eval_batch(rows, o.seq, o.packed));
  if (!std::isnan(first_loss))
    say("trained %lld steps in %s: loss %.4f -> %.4f (%.0f%% lower); held-out eval loss %.4f\n",
        static_cast<long long>(o.steps - first),
        clock_text(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()).c_str(),
        first_loss, last_loss, 100.0 * (1.0 - last_loss / first_loss), eval.loss);
  if (!o.save.empty()) say_saved(checkpoint::save(trainer, o, o.steps, "end"));  // HOOK

  if (o.generate > 0) {
    auto model = trainer.gather_model();  // collective: every rank takes part
    if (lead) {
      const std::string prompt_text = "This License";
      std::vector<std::int64_t> prompt;
      for (unsigned char c : prompt_text) prompt.push_back(c);
      const auto bytes = train::greedy_generate(model, prompt, o.generate, o.seq);
      std::string text = prompt_text;
      for (auto b : bytes) text += (b == '\n' || (b >= 32 && b < 127)) ? static_cast<char>(b) : '?';
      std::printf("generated (greedy, %d bytes after \"%s\"):\n%s\n", o.generate, prompt_text.c_str(), text.c_str());
    }
  }
  return exit_code::ok;
}

// Dispatches the run-time choices (element type, attention backend) to run_rank. prepare()
// refused a backend this build lacks.
template <class Comm>
int run_any(Comm& world, const options& o, const prepared& p, std::FILE* metrics) {
#if BATON_HAS_KOKKOS()
  if (o.backend == "kokkos")
    return o.dtype != "double" ? run_rank<float, baton::kokkos_attention>(world, o, p, metrics)  // bf16: float's
                               : run_rank<double, baton::kokkos_attention>(world, o, p, metrics);
#endif
  return o.dtype != "double" ? run_rank<float, baton::reference_attention>(world, o, p, metrics)
                             : run_rank<double, baton::reference_attention>(world, o, p, metrics);
}

}  // namespace train_lm
