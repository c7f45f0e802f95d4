// build error: all_reduce supports float, double, std::int32_t and std::int64_t
// all_reduce on a type no backend reduces: rejected with a message naming the types it takes.
#include <baton/comm/local.hpp>

#include <cstdint>
#include <vector>

int main() {
  baton::run_local(2, [](baton::local_communicator& c) {
    std::vector<std::int16_t> v(4);
    c.all_reduce(std::span(v), baton::reduce_op::sum);
  });
}
