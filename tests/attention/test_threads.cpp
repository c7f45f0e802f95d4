// Several threads (the ranks of an in-process world) calling the backend at once: results
// must equal the single-threaded ones bit for bit, and ThreadSanitizer (label "threads")
// must see no race. Kokkos 3.4's Serial backend is not re-entrant for reductions or team
// policies; the backend only launches flat range policies, which is what this proves.
#include "catch.hpp"

#include "attention_test_util.hpp"

#include <baton/attention.hpp>

#include <thread>
#include <vector>

namespace {
#if BATON_HAS_KOKKOS()
using backend_type = baton::kokkos_attention;
#else
using backend_type = baton::reference_attention;
#endif
}  // namespace

TEST_CASE("two threads run forward and backward concurrently", "[attention][threads]") {
  const attn_test::shape shapes[2] = {{1, 70, 90, 4, 2, 32}, {2, 33, 64, 2, 1, 16}};
  attn_test::inputs<float> inputs[2] = {attn_test::random_inputs<float>(shapes[0], 1),
                                        attn_test::random_inputs<float>(shapes[1], 2)};
  baton::attention_params params[2];
  params[1].q_pos = baton::positions(31, shapes[1].seq_q);
  attn_test::results<float> expected[2];
  for (int t = 0; t < 2; ++t) expected[t] = attn_test::run(backend_type{}, inputs[t], baton::causal_mask{}, params[t]);

  const backend_type shared_backend;  // one backend object used by both threads, as ranks may
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
