// One rank of baton-train, for any communicator: build the trainer, train, evaluate, generate.
#pragma once

#include "options.hpp"

#include <baton/attention/reference.hpp>
#include <baton/config.hpp>
#include <baton/nn/blas.hpp>
#include <baton/train.hpp>
#if BATON_HAS_KOKKOS()
#include <baton/attention/kokkos.hpp>
#endif

#include <algorithm>
#include <cmath>
#include <optional>
#include <cstdio>
#include <string>
#include <vector>

namespace train_lm {

// What a rank's run ends with: 0, or 2 for a configuration error (printed by rank 0).
template <class T, class Backend, class Comm>
int run_rank(Comm& world, const options& o) {
  namespace train = baton::train;
  const bool lead = world.rank() == 0;
  const auto say = [&](const char* fmt, auto... args) {
    if (lead) {
      std::printf(fmt, args...);
      std::fflush(stdout);
    }
  };
  const train::lm_config config = o.config();
  const train::lm_parallelism parallelism = o.parallelism();
  // Every rank meets the same configuration errors, before any work: each stops, rank 0 says why.
  const auto fail = [&](const std::string& what, const std::string& flags) {
    if (lead) std::fprintf(stderr, "baton-train: %s\nbaton-train: change %s\n", what.c_str(), flags.c_str());
    return 2;
  };
  std::optional<train::byte_corpus> corpus;
  std::optional<train::lm_trainer<T, Comm, Backend>> trainer;
  try {
    corpus.emplace(train::byte_corpus::from_file(o.data));
    trainer.emplace(world, config, parallelism, make_schedule(o));
    (void)corpus->train_batch(0, o.batch * o.dp, o.seq, o.packed);  // a text too short for the sequence
  } catch (const train::config_error& e) {
    return fail(e.what(), flags_for(e.setting()));
  } catch (const baton::schedule_error& e) {
    return fail(e.what(), "--schedule, --pp or --microbatches");
  } catch (const baton::nn::nn_error& e) {
    return fail(e.what(), "--data or --seq");
  }
  const auto& shape = trainer->executor().lowered_program().shape;
  say("baton-train: %d ranks = %s, cp %s (%s), schedule %s: %d stages on %d ranks, %d microbatches\n",
      world.size(), parallelism.mesh.text().c_str(), std::string(baton::nn::to_string(o.cp_mode)).c_str(),
      std::string(baton::to_string(o.layout)).c_str(), o.schedule.c_str(), shape.num_stages(), shape.ranks,
      shape.microbatches);
  say("model: %lld layers, d_model %lld, %lld heads / %lld kv heads, vocab 256 (bytes), %s; %s attention; "
      "OpenBLAS kernel %s\n",
      static_cast<long long>(o.layers), static_cast<long long>(o.d_model), static_cast<long long>(o.heads),
      static_cast<long long>(o.kv_heads), o.dtype.c_str(), o.backend.c_str(), baton::nn::blas_kernel().c_str());
  say("data: %s (%lld bytes%s), seq %lld, %lld rows per step (%lld per dp replica)\n", o.data.c_str(),
      static_cast<long long>(corpus->size()), o.packed ? ", packed paragraphs with a document mask" : "",
      static_cast<long long>(o.seq), static_cast<long long>(o.batch * o.dp), static_cast<long long>(o.batch));

  const std::int64_t rows = o.batch * o.dp;
  int first = 0;
  if (o.check) {
    // One step both ways: the mesh, and the same model on one rank (rank 0), then every
    // parameter compared.
    const train::lm_batch batch = corpus->train_batch(0, rows, o.seq, o.packed);
    const auto mesh_report = trainer->step(batch);
    auto mesh_params = trainer->parameters();
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
      std::printf("check: step 0 loss %.10f on the mesh, %.10f on one rank; worst parameter difference %.2e "
                  "(%.2e relative to the largest)\n",
                  mesh_report.loss, ref_report.loss, worst, largest > 0 ? worst / largest : worst);
    }
    first = 1;
  }

  double first_loss = NAN, last_loss = NAN;
  for (int step = first; step < o.steps; ++step) {
    const auto r = trainer->step(corpus->train_batch(step, rows, o.seq, o.packed));
    if (std::isnan(first_loss)) first_loss = r.loss;
    last_loss = r.loss;
    if (step % o.log_every == 0 || step + 1 == o.steps)
      say("step %4d | loss %.*f | %6.0f tok/s | bubble %.3f | saved %.2f MiB | grad norm %.3f\n", step, o.loss_digits, r.loss,
          static_cast<double>(r.tokens) / r.seconds, r.bubble_fraction,
          static_cast<double>(r.peak_saved_bytes) / (1 << 20), r.grad_norm);
  }
  const auto eval = trainer->eval(corpus->eval_batch(rows, o.seq, o.packed));
  if (!std::isnan(first_loss))
    say("trained %d steps: loss %.4f -> %.4f (%.0f%% lower); held-out eval loss %.4f\n", o.steps - first, first_loss,
        last_loss, 100.0 * (1.0 - last_loss / first_loss), eval.loss);

  if (o.generate > 0) {
    auto model = trainer->gather_model();  // collective: every rank takes part
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
  return 0;
}

// Dispatches the run-time choices (element type, attention backend) to run_rank.
template <class Comm>
int run_any(Comm& world, const options& o) {
  if (o.backend == "kokkos") {
#if BATON_HAS_KOKKOS()
    return o.dtype == "float" ? run_rank<float, baton::kokkos_attention>(world, o)
                              : run_rank<double, baton::kokkos_attention>(world, o);
#else
    if (world.rank() == 0) std::fprintf(stderr, "baton-train: built without Kokkos; use --backend reference\n");
    return 2;
#endif
  }
  return o.dtype == "float" ? run_rank<float, baton::reference_attention>(world, o)
                            : run_rank<double, baton::reference_attention>(world, o);
}

}  // namespace train_lm
