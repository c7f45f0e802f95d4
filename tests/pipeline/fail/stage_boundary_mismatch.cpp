// Must not compile: stage 0 outputs float tensors but stage 1 takes double tensors.
// build error: baton::stage_list<S0, S1, ...>: the output type of stage I must be exactly the input type of stage I.1, but at one boundary they differ. the compiler shows I and both types with this error, as stage_output_matches_next_input<I, output of stage I, input of stage I.1>. make the two types the same, converting inside one of the two stages
#include <baton/comm.hpp>
#include <baton/payload.hpp>
#include <baton/pipeline.hpp>
#include <baton/schedule.hpp>

template <class In, class Out>
struct cast_stage {
  using input = baton::host_tensor<In>;
  using output = baton::host_tensor<Out>;
  using side = baton::no_side;
  struct saved {};
  output forward(const input& x, const side&, saved&) { return output(x.shape()); }
  baton::grad_t<input> backward(saved&, const baton::grad_t<output>& dy) { return input(dy.shape()); }
};

struct loss {
  baton::loss_result<baton::host_tensor<double>> operator()(const baton::host_tensor<double>& y,
                                                            const baton::host_tensor<double>&) const {
    return {0.0, y};
  }
};

void build(baton::local_communicator& comm) {
  using stages = baton::stage_list<cast_stage<double, float>, cast_stage<double, double>>;
  auto exec = baton::make_pipeline<baton::one_f_one_b, stages>(
      comm, baton::schedule_shape{2, 1, 2},
      [](auto i) {
        if constexpr (i == 0) return cast_stage<double, float>{};
        else return cast_stage<double, double>{};
      },
      loss{});
}
