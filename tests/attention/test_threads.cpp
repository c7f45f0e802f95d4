// Several threads (the ranks of an in-process world) calling one backend object at once:
// results must equal the single-threaded ones bit for bit, and ThreadSanitizer (label
// "threads") must see no race. Kokkos 3.4's Serial backend is not re-entrant for reductions
// or team policies; the Kokkos backend only launches flat range policies, which its case
// proves. Without Kokkos that case skips (it never falls back to another backend).
#include "catch.hpp"
#include "skip.hpp"

#include "attention_test_util.hpp"

#include <baton/attention.hpp>
#include <baton/config.hpp>
#if BATON_HAS_KOKKOS()
#include <baton/attention/kokkos.hpp>
#endif

#include <thread>
#include <vector>

namespace {

template <class Backend>
void check_concurrent_calls() {
  const attn_test::shape shapes[2] = {{1, 70, 90, 4, 2, 32}, {2, 33, 64, 2, 1, 16}};
  attn_test::inputs<float> inputs[2] = {attn_test::random_inputs<float>(shapes[0], 1),
                                        attn_test::random_inputs<float>(shapes[1], 2)};
  baton::attention_params params[2];
  params[1].q_pos = baton::positions(31, shapes[1].seq_q);
  attn_test::results<float> expected[2];
  for (int t = 0; t < 2; ++t) expected[t] = attn_test::run(Backend{}, inputs[t], baton::causal_mask{}, params[t]);

  const Backend shared_backend;  // one backend object used by both threads, as ranks may
  attn_test::results<float> got[2][3];
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 3; ++rep) got[t][rep] = attn_test::run(shared_backend, inputs[t], baton::causal_mask{}, params[t]);
    });
  for (auto& th : threads) th.join();

  for (int t = 0; t < 2; ++t)
    for (int rep = 0; rep < 3; ++rep) {
      CHECK(got[t][rep].out == expected[t].out);
      CHECK(got[t][rep].lse == expected[t].lse);
      CHECK(got[t][rep].dq == expected[t].dq);
      CHECK(got[t][rep].dk == expected[t].dk);
      CHECK(got[t][rep].dv == expected[t].dv);
    }
}

}  // namespace

TEST_CASE("reference backend: two threads run forward and backward concurrently", "[attention][threads]") {
  check_concurrent_calls<baton::reference_attention>();
}

TEST_CASE("kokkos backend: two threads run forward and backward concurrently", "[attention][threads][kokkos][kokkos-threads][can-skip]") {
#if BATON_HAS_KOKKOS()
  check_concurrent_calls<baton::kokkos_attention>();
#else
  BATON_SKIP("Kokkos is not linked (baton::kokkos): the Kokkos backend's concurrent calls are not tested");
#endif
}
