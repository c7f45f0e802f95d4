// The tag registry (core/tags.hpp): baton's protocols and data streams use disjoint tag
// ranges, so the pipeline and context-parallel attention can share one communicator, and
// the pipeline's data tags never repeat within a call however many microbatches it runs
// (before, they were taken modulo 30000 and repeated past 15,000 stage-microbatches).
#include "catch.hpp"

#include <baton/attention/masks.hpp>
#include <baton/attention/reference.hpp>
#include <baton/comm/local.hpp>
#include <baton/core/tags.hpp>
#include <baton/cp/ring.hpp>
#include <baton/cp/sharding.hpp>
#include <baton/payload/host_tensor.hpp>
#include <baton/pipeline/executor.hpp>
#include <baton/schedule/policies.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace {

// A local communicator that records the tag of every message this rank sends.
struct tag_log {
  std::vector<int> pipeline, cp;
  std::vector<int>* current = &pipeline;
  std::vector<std::pair<int, int>> pipeline_sends;  // (dest, tag)
};

struct audited_communicator {
  baton::local_communicator* comm;
  tag_log* log;

  int rank() const { return comm->rank(); }
  int size() const { return comm->size(); }
  baton::local_request isend(std::span<const std::byte> data, int dest, int tag) {
    log->current->push_back(tag);
    if (log->current == &log->pipeline) log->pipeline_sends.emplace_back(dest, tag);
    return comm->isend(data, dest, tag);
  }
  baton::local_request irecv(std::span<std::byte> data, int source, int tag) { return comm->irecv(data, source, tag); }
  baton::local_request shift(std::span<const std::byte> send, std::span<std::byte> recv, int k, int tag) {
    log->current->push_back(tag);
    return comm->shift(send, recv, k, tag);
  }
};
static_assert(baton::point_to_point_communicator<audited_communicator> && baton::ring_communicator<audited_communicator>);

// y = x * w per feature; mean squared error. Small enough to run thousands of microbatches.
struct scale_stage {
  using input = baton::host_tensor<double>;
  using output = baton::host_tensor<double>;
  using side = baton::no_side;
  struct saved {
    input x;
    std::size_t bytes() const { return static_cast<std::size_t>(x.size()) * sizeof(double); }
  };
  double w = 1;
  double dw = 0;
  output forward(const input& x, const side&, saved& st) {
    st.x = x;
    output y(x.shape());
    for (std::int64_t i = 0; i < x.size(); ++i) y[i] = x[i] * w;
    return y;
  }
  baton::grad_t<input> backward(saved& st, const baton::grad_t<output>& dy) {
    input dx(dy.shape());
    for (std::int64_t i = 0; i < dy.size(); ++i) {
      dx[i] = dy[i] * w;
      dw += dy[i] * st.x[i];
    }
    return dx;
  }
};

struct half_squared_error {
  baton::loss_result<baton::host_tensor<double>> operator()(const baton::host_tensor<double>& y,
                                                            const baton::host_tensor<double>& t) const {
    baton::loss_result<baton::host_tensor<double>> r{0.0, baton::host_tensor<double>(y.shape())};
    for (std::int64_t i = 0; i < y.size(); ++i) {
      r.value += 0.5 * (y[i] - t[i]) * (y[i] - t[i]);
      r.grad[i] = y[i] - t[i];
    }
    return r;
  }
};

}  // namespace

TEST_CASE("tags: baton's ranges are disjoint, above the application's, and the cp range is fixed", "[core][tags]") {
  STATIC_REQUIRE(baton::tags::registry::disjoint);
  STATIC_REQUIRE(baton::tags::comm_mpi::first >= baton::tags::first_reserved);
  STATIC_REQUIRE(baton::tags::cp::last < baton::tags::pipeline::first);
  STATIC_REQUIRE(baton::tags::cp::tag<3> == baton::tags::cp::last);
  STATIC_REQUIRE(baton::tags::pipeline::open_ended);
}

TEST_CASE("tags: the pipeline (over 15,000 stage-microbatches) and ring attention share one communicator",
          "[core][tags][threads]") {
  // 2 stages x 7600 microbatches = 15,200 stage-microbatches: 30,402 tags, past the 30,000
  // at which the data tags used to wrap around.
  constexpr int microbatches = 7600;
  constexpr std::int64_t seq = 8, heads = 2, dim = 4;
  std::vector<tag_log> logs(2);
  std::vector<double> losses(2, -1), cp_errors(2, -1);
  std::vector<std::int64_t> tag_counts(2, 0);

  baton::run_local(2, [&](baton::local_communicator& comm) {
    const int r = comm.rank();
    tag_log& log = logs[static_cast<std::size_t>(r)];
    audited_communicator audited{&comm, &log};

    // The pipeline: stage s scales by 1 + s / 4, one row per microbatch.
    auto pipe = baton::make_pipeline<baton::one_f_one_b, baton::uniform_stages<scale_stage>>(
        audited, baton::shape_for<baton::one_f_one_b>(2, microbatches),
        [](int stage) { return scale_stage{1.0 + stage / 4.0, 0.0}; }, half_squared_error{},
        baton::pipeline_options{.loss_on_every_rank = true});
    tag_counts[static_cast<std::size_t>(r)] = pipe.tag_count();
    baton::host_tensor<double> batch({microbatches, 1}), target({microbatches, 1});
    for (std::int64_t i = 0; i < microbatches; ++i) {
      batch[i] = std::sin(0.01 * static_cast<double>(i));
      target[i] = 0.5 * batch[i];
    }
    losses[static_cast<std::size_t>(r)] = pipe.step(batch, target).loss.value();

    // Ring attention on the same communicator, each rank holding half of the sequence.
    log.current = &log.cp;
    std::vector<double> q(static_cast<std::size_t>(seq * heads * dim)), k(q.size()), v(q.size());
    for (std::size_t i = 0; i < q.size(); ++i) {
      q[i] = std::cos(0.3 * static_cast<double>(i));
      k[i] = std::sin(0.7 * static_cast<double>(i));
      v[i] = std::cos(1.1 * static_cast<double>(i) + 0.5);
    }
    const baton::sequence_sharding sharding(baton::shard_layout::contiguous, seq, 2);
    const std::int64_t local = seq / 2, first = r * local;
    const auto full = [&](std::vector<double>& x) { return baton::make_tensor_view(x.data(), {1, seq, heads, dim}); };
    const auto mine = [&](std::vector<double>& x) { return full(x).slice(1, first, local).as_const(); };
    std::vector<double> out(static_cast<std::size_t>(local * heads * dim)), lse(static_cast<std::size_t>(heads * local));
    baton::ring_attention ring(audited, baton::reference_attention{}, sharding);
    ring.forward<double>(mine(q), mine(k), mine(v), baton::causal_mask{}, baton::make_tensor_view(out.data(), {1, local, heads, dim}),
                         baton::make_tensor_view(lse.data(), {1, heads, local}));
    std::vector<double> ref_out(q.size()), ref_lse(static_cast<std::size_t>(heads * seq));
    baton::reference_attention{}.forward(full(q).as_const(), full(k).as_const(), full(v).as_const(),
                                                 baton::causal_mask{}, full(ref_out),
                                                 baton::make_tensor_view(ref_lse.data(), {1, heads, seq}));
    double err = 0;
    const auto ref = full(ref_out).slice(1, first, local);
    for (std::int64_t s = 0; s < local; ++s)
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t d = 0; d < dim; ++d)
          err = std::max(err, std::abs(out[static_cast<std::size_t>((s * heads + h) * dim + d)] - ref(0, s, h, d)));
    cp_errors[static_cast<std::size_t>(r)] = err;
  });

  // The loss the pipeline must give: the mean over microbatches of 0.5 (x w0 w1 - t)^2.
  double want = 0;
  for (int i = 0; i < microbatches; ++i) {
    const double x = std::sin(0.01 * i), y = x * 1.0 * 1.25, t = 0.5 * x;
    want += 0.5 * (y - t) * (y - t) / microbatches;
  }
  CHECK(losses[0] == Approx(want).epsilon(1e-12));  // summation order differs from the pipeline's
  CHECK(losses[1] == losses[0]);
  // Exact up to the order of the softmax sums: reference_attention accumulates in double.
  CHECK(cp_errors[0] < 1e-12);
  CHECK(cp_errors[1] < 1e-12);

  CHECK(tag_counts[0] == 2 + 2 * 2 * microbatches);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    const tag_log& log = logs[static_cast<std::size_t>(r)];
    // Every pipeline message of the call has its own (destination, tag): none repeats.
    std::set<std::pair<int, int>> distinct(log.pipeline_sends.begin(), log.pipeline_sends.end());
    CHECK(distinct.size() == log.pipeline_sends.size());
    CHECK(log.pipeline_sends.size() > microbatches);  // a message per microbatch (small data travels inline)
    const auto [low, high] = std::minmax_element(log.pipeline.begin(), log.pipeline.end());
    CHECK(*low >= baton::tags::pipeline::first);
    CHECK(*high < baton::tags::pipeline::first + tag_counts[0]);
    CHECK(*high > baton::tags::pipeline::first + 30000);  // past where the old tags wrapped
    REQUIRE_FALSE(log.cp.empty());
    for (int tag : log.cp) {
      CHECK(tag >= baton::tags::cp::first);
      CHECK(tag <= baton::tags::cp::last);
    }
  }
}

TEST_CASE("tags: a schedule that needs more tags than the communicator has is refused, naming the limit",
          "[core][tags][threads]") {
  // A communicator with MPI's smallest allowed tag bound, 32767.
  struct bounded : audited_communicator {
    int max_tag() const { return 32767; }
  };
  // Catch's assertions are not thread-safe: each rank records, the main thread checks.
  std::vector<std::string> fits(2), too_many(2), negative_offset(2);
  const auto error_of = [](auto&& make) -> std::string {
    try {
      make();
    } catch (const baton::pipeline_error& e) {
      return e.what();
    }
    return "(no error)";
  };
  baton::run_local(2, [&](baton::local_communicator& comm) {
    tag_log log;
    bounded c{{&comm, &log}};
    const auto make = [&](int microbatches, baton::pipeline_options options = {}) {
      return baton::make_pipeline<baton::one_f_one_b, baton::uniform_stages<scale_stage>>(
          c, baton::shape_for<baton::one_f_one_b>(2, microbatches), [](int) { return scale_stage{}; },
          half_squared_error{}, options);
    };
    const auto r = static_cast<std::size_t>(comm.rank());
    fits[r] = error_of([&] { (void)make(7000); });
    too_many[r] = error_of([&] { (void)make(9000); });
    baton::pipeline_options negative;
    negative.tag_offset = -1;
    negative_offset[r] = error_of([&] { (void)make(4, negative); });
  });
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK(fits[r] == "(no error)");
    CHECK_THAT(too_many[r], Catch::Contains("the schedule needs 36002 message tags") &&
                                Catch::Contains("the communicator's largest tag is 32767"));
    CHECK_THAT(negative_offset[r], Catch::Contains("tag_offset is -1"));
  }
}
