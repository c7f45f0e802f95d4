// Must not compile: a split-backward schedule (ZBV runs I and W separately) given a stage
// that only has a full backward.
// build error: baton: this split-backward schedule needs a stage with backward_input/backward_weight: give the stage `baton::grad_t<input> backward_input.saved&, const baton::grad_t<output>&.` and `void backward_weight.saved&.`, or use a full-backward schedule .baton::gpipe, baton::one_f_one_b, baton::interleaved_1f1b, baton::looped_bfs.
#include <baton/comm.hpp>
#include <baton/payload.hpp>
#include <baton/pipeline.hpp>
#include <baton/schedule.hpp>

struct full_backward_only {
  using input = baton::host_tensor<double>;
  using output = baton::host_tensor<double>;
  using side = baton::no_side;
  struct saved {};
  output forward(const input& x, const side&, saved&) { return x; }
  baton::grad_t<input> backward(saved&, const baton::grad_t<output>& dy) { return dy; }
};

struct loss {
  baton::loss_result<baton::host_tensor<double>> operator()(const baton::host_tensor<double>& y,
                                                            const baton::host_tensor<double>&) const {
    return {0.0, y};
  }
};

void build(baton::local_communicator& comm) {
  auto exec = baton::make_pipeline<baton::zbv, baton::uniform_stages<full_backward_only>>(
      comm, baton::shape_for<baton::zbv>(2, 4), [](int) { return full_backward_only{}; }, loss{});
}
