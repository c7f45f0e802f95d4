// Summing gradients over the replicas of a data- or context-parallel group (ranks as
// threads of the local world).
#include <baton/comm/local.hpp>
#include <baton/nn.hpp>

#include "catch.hpp"
#include "nn_test_util.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace nn = baton::nn;

TEST_CASE("nn all_reduce_gradients: sums (or averages) every gradient over the group", "[nn][optim]") {
  // Catch's assertions are not thread-safe: each rank reports what it saw.
  struct seen {
    std::vector<std::string> names;
    bool summed = true, averaged = true, zeroed = true;
    std::int64_t count = 0;
  };
  const auto results = baton::run_local(3, [](baton::local_communicator& comm) {
    nn::linear<double> a(4, 3, true, nn::initializer(1) / "a");
    nn::rms_norm<double> b(5);
    auto list = nn::parameters_of<double>(a, "a");
    nn::append_parameters(list, b, "b");
    seen s;
    for (const auto& p : list) s.names.push_back(p.name);
    const double r = comm.rank() + 1;
    for (auto& p : list)
      for (std::int64_t i = 0; i < p.parameter->grad.size(); ++i) p.parameter->grad[i] = r * static_cast<double>(i + 1);
    // Tiny buckets: every parameter spans its own all_reduce, and one spans two.
    nn::all_reduce_gradients(list, comm, nn::gradient_reduction::sum, 7);
    for (auto& p : list)
      for (std::int64_t i = 0; i < p.parameter->grad.size(); ++i)
        s.summed = s.summed && p.parameter->grad[i] == 6.0 * static_cast<double>(i + 1);
    nn::all_reduce_gradients(list, comm, nn::gradient_reduction::mean);  // equal values: the mean keeps them
    for (auto& p : list)
      for (std::int64_t i = 0; i < p.parameter->grad.size(); ++i)
        s.averaged = s.averaged && p.parameter->grad[i] == 6.0 * static_cast<double>(i + 1);
    nn::zero_grad(list);
    for (auto& p : list)
      for (double g : p.parameter->grad.values()) s.zeroed = s.zeroed && g == 0.0;
    s.count = nn::parameter_count(list);
    return s;
  });
  for (const seen& s : results) {
    CHECK(s.names == std::vector<std::string>{"a.weight", "a.bias", "b.weight"});
    CHECK(s.summed);
    CHECK(s.averaged);
    CHECK(s.zeroed);
    CHECK(s.count == 4 * 3 + 3 + 5);
  }
}

TEST_CASE("nn all_reduce_gradients: the mean divides by the group size", "[nn][optim]") {
  const auto grads = baton::run_local(2, [](baton::local_communicator& comm) {
    nn::rms_norm<float> norm(3);
    const auto list = nn::parameters_of<float>(norm);
    norm.gain().grad.fill(comm.rank() == 0 ? 1.0f : 3.0f);
    nn::all_reduce_gradients(list, comm, nn::gradient_reduction::mean);
    return norm.gain().grad[2];
  });
  CHECK(grads[0] == 2.0f);
  CHECK(grads[1] == 2.0f);
}
