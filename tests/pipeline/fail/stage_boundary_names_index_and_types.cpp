// Must not compile: of three stages, the first two chain (double tensors) but stage 1 outputs
// float tensors where stage 2 takes double tensors. The error names that boundary, 1, and both
// types, as the arguments of baton's stage_output_matches_next_input (GCC prints
// "<1, A, B >" in the note under the error, Clang "<1UL, A, B>" in the error line).
// build error: stage_output_matches_next_input<1U?L?, baton::host_tensor<float>, baton::host_tensor<double> ?>
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
  using stages =
      baton::stage_list<cast_stage<double, double>, cast_stage<double, float>, cast_stage<double, double>>;
  auto exec = baton::make_pipeline<baton::one_f_one_b, stages>(
      comm, baton::schedule_shape{3, 1, 3},
      [](auto i) {
        if constexpr (i == 1) return cast_stage<double, float>{};
        else return cast_stage<double, double>{};
      },
      loss{});
}
